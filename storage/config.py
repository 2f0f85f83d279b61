"""Configuration every part shares: where the data lives and which folders jobs may read.

Read from the environment and from a TOML file; the environment wins, so a
one-off `DRAINBOARD_DATA=/tmp/x python -m jobs list` overrides the file.

    # drainboard.toml (in the working directory, or the file DRAINBOARD_CONFIG names)
    data_dir = "/srv/drainboard"
    model_roots = ["/srv/models", "/mnt/checkpoints"]
    address = "0.0.0.0"
    port = 8501
    memory_floor = "8GiB"   # the memory guard's floor: a size, "auto" (the default) or "off"
    ray_address = "http://head:8265"   # run jobs on a Ray cluster (jobs/backends/ray_jobs.py); unset: this machine
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from loader.errors import DrainboardError

CONFIG_FILE_NAME = "drainboard.toml"
_FILE_KEYS = {"data_dir", "model_roots", "address", "port", "memory_floor", "ray_address"}


class ConfigError(DrainboardError):
    """The config file or an environment variable holds something unusable."""


class ModelPathError(DrainboardError):
    """A model path is missing or lies outside every configured model root."""


@dataclass(frozen=True)
class Config:
    """Where Drainboard keeps its state and what it may read."""

    data_dir: Path
    """Folder holding the database (`drainboard.db`), job artifacts and the demo checkpoint."""
    model_roots: list[Path] = field(default_factory=list)
    """Folders jobs may read checkpoints from; a model path outside all of them is refused."""
    address: str = "127.0.0.1"
    """Address the dashboard listens on (loopback unless the user opens it up)."""
    port: int = 8501
    """Port the dashboard listens on."""
    memory_floor: str | None = None
    """The memory guard's floor as written (a size, `auto` or `off`; None is `auto`); `jobs.guard` reads it."""
    ray_address: str | None = None
    """The Ray cluster's dashboard address (`http://head:8265`) jobs are submitted to; None runs them here."""

    @property
    def db_path(self) -> Path:
        """The one SQLite database."""
        return self.data_dir / "drainboard.db"

    @property
    def artifacts_dir(self) -> Path:
        """Parent of every job's artifact folder."""
        return self.data_dir / "artifacts"


def _read_file(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            values = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    unknown = sorted(set(values) - _FILE_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(_FILE_KEYS))}")
    if "model_roots" in values and not (
        isinstance(values["model_roots"], list) and all(isinstance(r, str) for r in values["model_roots"])
    ):
        raise ConfigError(f"{path}: model_roots must be a list of folder paths, got {values['model_roots']!r}")
    if "memory_floor" in values and (isinstance(values["memory_floor"], bool)
                                     or not isinstance(values["memory_floor"], (str, int))):
        raise ConfigError(f"{path}: memory_floor must be a size such as \"8GiB\", \"auto\" or \"off\", "
                          f"got {values['memory_floor']!r}")
    return values


def _parse_port(value: object, source: str) -> int:
    try:
        port = int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: port must be an integer, got {value!r}") from None
    if not 0 < port < 65536:
        raise ConfigError(f"{source}: port must be between 1 and 65535, got {port}")
    return port


def load_config(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Config:
    """The effective configuration: defaults, then the config file, then the environment.

    Relative paths in the file are taken relative to the file's folder; in the
    environment, relative to `cwd`.
    """
    env = os.environ if env is None else env
    cwd = Path.cwd() if cwd is None else cwd
    file_path = Path(env["DRAINBOARD_CONFIG"]) if env.get("DRAINBOARD_CONFIG") else cwd / CONFIG_FILE_NAME
    if env.get("DRAINBOARD_CONFIG") and not file_path.is_file():
        raise ConfigError(f"DRAINBOARD_CONFIG names {file_path}, which is not a file")
    values = _read_file(file_path) if file_path.is_file() else {}
    file_base = file_path.resolve().parent

    data_dir = file_base / values["data_dir"] if "data_dir" in values else cwd / "data"
    if env.get("DRAINBOARD_DATA"):
        data_dir = cwd / env["DRAINBOARD_DATA"]
    roots = [file_base / r for r in values.get("model_roots", [])]
    if env.get("DRAINBOARD_MODEL_ROOTS"):
        roots = [cwd / r for r in env["DRAINBOARD_MODEL_ROOTS"].split(os.pathsep) if r]
    if not roots:
        roots = [data_dir / "models"]
    address = env.get("DRAINBOARD_ADDRESS") or str(values.get("address", "127.0.0.1"))
    port_source = "DRAINBOARD_PORT" if env.get("DRAINBOARD_PORT") else str(file_path)
    port = _parse_port(env.get("DRAINBOARD_PORT") or values.get("port", 8501), port_source)
    floor = env.get("DRAINBOARD_MEMORY_FLOOR") or values.get("memory_floor")
    ray_address = env.get("DRAINBOARD_RAY_ADDRESS") or values.get("ray_address")
    if ray_address is not None and not (isinstance(ray_address, str) and ray_address.startswith(("http://", "https://"))):
        source = "DRAINBOARD_RAY_ADDRESS" if env.get("DRAINBOARD_RAY_ADDRESS") else str(file_path)
        raise ConfigError(f"{source}: ray_address must be the Ray dashboard's http(s) address such as "
                          f"\"http://head:8265\", got {ray_address!r}")
    return Config(data_dir=data_dir.resolve(), model_roots=[r.resolve() for r in roots], address=address, port=port,
                  memory_floor=None if floor is None else str(floor), ray_address=ray_address)


def resolve_model_path(path: str | os.PathLike, roots: list[Path]) -> Path:
    """The real path of a user-given checkpoint path, refused unless it lies under a root.

    Symlinks are resolved first, so a link inside a root pointing elsewhere is
    refused too. Raises `ModelPathError`.
    """
    raw = Path(path).expanduser()
    real = raw.resolve()
    for root in roots:
        if real.is_relative_to(Path(root).resolve()):
            if not real.exists():
                raise ModelPathError(f"{raw} does not exist")
            return real
    listed = ", ".join(str(r) for r in roots) or "(none configured)"
    raise ModelPathError(f"{raw} is outside the model roots ({listed}); set DRAINBOARD_MODEL_ROOTS to allow it")
