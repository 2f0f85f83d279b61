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
    hub_cache = false   # the Hugging Face cache is a read-only model root when it exists (default: true)

Every value is checked here, when any part (worker, CLI, dashboard) starts:
a bad setting is one `ConfigError` line naming the setting, before any job
is claimed, never a job that fails later for it.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

from core.echo import echo
from core.errors import SHOWN_PROBLEMS, DrainboardError
from core.hub_cache import holding_root, hub_cache_folder, link_root
from core.sizes import SizeError, parse_size

CONFIG_FILE_NAME = "drainboard.toml"
_FILE_KEYS = {"data_dir", "model_roots", "address", "port", "memory_floor", "ray_address", "hub_cache"}
MIN_MEMORY_FLOOR = 2**20
"""The smallest memory floor accepted (1 MiB), as for a job's own floor."""


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
    hub_cache: Path | None = None
    """The Hugging Face cache folder, one of `model_roots` (read only, no set-up); None when it does not
    exist or the `hub_cache` setting turns it off."""

    def to_json(self) -> str:
        """The configuration as it was resolved, for a process this one starts (`ENV_RESOLVED`)."""
        return json.dumps(asdict(self), default=str)  # its paths as text

    @classmethod
    def from_json(cls, text: str) -> Config:
        """A configuration from `to_json`."""
        values = json.loads(text)
        hub = values["hub_cache"]
        return cls(**{**values, "data_dir": Path(values["data_dir"]), "hub_cache": None if hub is None else Path(hub),
                      "model_roots": [Path(root) for root in values["model_roots"]]})

    @property
    def db_path(self) -> Path:
        """The one SQLite database."""
        return self.data_dir / "drainboard.db"

    @property
    def artifacts_dir(self) -> Path:
        """Parent of every job's artifact folder."""
        return self.data_dir / "artifacts"

    @property
    def dashboard_heartbeat(self) -> Path:
        """A file every open dashboard page touches every few seconds: a worker started on someone's behalf
        reads its age to tell whether anybody is left to use it (`jobs.supervisor`)."""
        return self.data_dir / "dashboard.alive"


def _read_file(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            values = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
                          f"a TOML file is UTF-8") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read: {e.strerror}") from None
    unknown = sorted(set(values) - _FILE_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown keys {', '.join(map(echo, unknown[:SHOWN_PROBLEMS]))}; known: {', '.join(sorted(_FILE_KEYS))}")
    if "model_roots" in values and not (
        isinstance(values["model_roots"], list) and all(isinstance(r, str) for r in values["model_roots"])
    ):
        raise ConfigError(f"{path}: model_roots must be a list of folder paths, got {echo(values['model_roots'])}")
    for key in ("data_dir", "address"):
        if key in values and not isinstance(values[key], str):
            raise ConfigError(f"{path}: {key} must be a string, got {echo(values[key])}")
    if "memory_floor" in values and (isinstance(values["memory_floor"], bool)
                                     or not isinstance(values["memory_floor"], (str, int))):
        raise ConfigError(f"{path}: memory_floor must be a size such as \"8GiB\", \"auto\" or \"off\", "
                          f"got {echo(values['memory_floor'])}")
    if "hub_cache" in values and not isinstance(values["hub_cache"], bool):
        raise ConfigError(f"{path}: hub_cache must be true or false, got {echo(values['hub_cache'])}")
    return values


def hub_cache_setting(env: Mapping[str, str], values: Mapping[str, object], file_path: Path) -> bool:
    """Whether the Hugging Face cache is a model root: `DRAINBOARD_HUB_CACHE` (on/off), else the file's
    `hub_cache`, else on."""
    text = env.get("DRAINBOARD_HUB_CACHE")
    if not text:
        return bool(values.get("hub_cache", True))
    word = text.strip().lower()
    if word in ("on", "1", "true", "yes"):
        return True
    if word in ("off", "0", "false", "no"):
        return False
    raise ConfigError(f"DRAINBOARD_HUB_CACHE must be on or off, got {echo(text)}")


def memory_floor_setting(text: str | None) -> int | str | None:
    """The configured memory floor read: bytes, None for `off`, or "auto" (the default: the guard's
    default floor on a unified-memory machine). Raises `ConfigError` naming the setting."""
    text = (text or "auto").strip()
    if text.lower() in ("auto", ""):
        return "auto"
    if text.lower() in ("off", "0", "none"):
        return None
    try:
        return parse_size(text, minimum=MIN_MEMORY_FLOOR)
    except SizeError as e:
        raise ConfigError(f"memory_floor (DRAINBOARD_MEMORY_FLOOR or drainboard.toml): {e}; "
                          f"or 'auto' (the default) or 'off'") from None


def _check_data_dir(data_dir: Path, source: str) -> None:
    """The data folder must be a folder, or not exist yet under a folder (it is created): a file there, or
    above it, strands every part."""
    existing = next((p for p in (data_dir, *data_dir.parents) if p.exists()), data_dir)
    if existing.exists() and not existing.is_dir():
        what = "which is not a folder" if existing == data_dir else f"under {existing}, which is not a folder"
        raise ConfigError(f"{source} names {data_dir}, {what}; the data folder holds the job database and artifacts")


def _parse_port(value: object, source: str) -> int:
    try:
        port = int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: port must be an integer, got {echo(value)}") from None
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
    data_source = f"data_dir in {file_path}" if "data_dir" in values else "the default data folder"
    if env.get("DRAINBOARD_DATA"):
        data_dir, data_source = cwd / env["DRAINBOARD_DATA"], "DRAINBOARD_DATA"
    _check_data_dir(data_dir, data_source)
    roots = [file_base / r for r in values.get("model_roots", [])]
    if env.get("DRAINBOARD_MODEL_ROOTS"):
        roots = [cwd / r for r in env["DRAINBOARD_MODEL_ROOTS"].split(os.pathsep) if r]
    if not roots:
        roots = [data_dir / "models"]
    hub = hub_cache_folder(env) if hub_cache_setting(env, values, file_path) else None
    hub = hub.resolve() if hub is not None and hub.is_dir() else None
    roots = [r.resolve() for r in roots]
    if hub is not None and hub not in roots:
        roots.append(hub)
    address = env.get("DRAINBOARD_ADDRESS") or str(values.get("address", "127.0.0.1"))
    port_source = "DRAINBOARD_PORT" if env.get("DRAINBOARD_PORT") else str(file_path)
    port = _parse_port(env.get("DRAINBOARD_PORT") or values.get("port", 8501), port_source)
    floor = env.get("DRAINBOARD_MEMORY_FLOOR") or values.get("memory_floor")
    memory_floor_setting(None if floor is None else str(floor))
    ray_address = env.get("DRAINBOARD_RAY_ADDRESS") or values.get("ray_address")
    if ray_address is not None and not (isinstance(ray_address, str) and ray_address.startswith(("http://", "https://"))):
        source = "DRAINBOARD_RAY_ADDRESS" if env.get("DRAINBOARD_RAY_ADDRESS") else str(file_path)
        raise ConfigError(f"{source}: ray_address must be the Ray dashboard's http(s) address such as "
                          f"\"http://head:8265\", got {ray_address!r}")
    return Config(data_dir=data_dir.resolve(), model_roots=roots, address=address, port=port,
                  memory_floor=None if floor is None else str(floor), ray_address=ray_address, hub_cache=hub)


ENV_RESOLVED = "DRAINBOARD_RESOLVED_CONFIG"
"""The configuration a worker resolved, as JSON (`Config.to_json`), in the environment of each job child it
starts: the child uses it as it is and reads no file (`resolved_config`)."""


def resolved_config(env: Mapping[str, str] | None = None) -> Config:
    """The configuration handed down by the worker that started this process (`ENV_RESOLVED`), else
    `load_config()` (a job child started by hand). A child never re-reads `drainboard.toml`: the one in its
    working directory may be another, or half-written."""
    env = os.environ if env is None else env
    raw = env.get(ENV_RESOLVED)
    return load_config(env) if raw is None else Config.from_json(raw)


def resolve_model_path(path: str | os.PathLike, roots: list[Path]) -> Path:
    """The real path of a user-given checkpoint path, refused unless it lies under a root.

    Symlinks are resolved first, so a link inside a root pointing elsewhere is
    refused too; the one link kept is a Hugging Face snapshot's file linking into its own repository
    (`core.hub_cache.link_root`): its folder is resolved and its name kept, since the blob it names has
    no `.safetensors` name. Raises `ModelPathError`, naming the root that would hold the path.
    """
    raw = Path(path).expanduser()
    real = raw.resolve()
    if real != raw.absolute() and link_root(raw) is not None:
        real = raw.parent.resolve() / raw.name
    folders = [Path(root).resolve() for root in roots]
    for root in folders:
        if real.is_relative_to(root):
            if not real.exists():
                raise ModelPathError(f"{raw} does not exist")
            return real
    if not real.exists():
        raise ModelPathError(f"{raw} does not exist")
    listed = ", ".join(str(r) for r in roots) or "(none configured)"
    seen = "" if real == raw.absolute() else f" (it is {real})"
    holder = holding_root(real)
    raise ModelPathError(f"{raw} is outside the model roots ({listed}){seen}; a root holding it: {holder}. Add it "
                         f"to model_roots in drainboard.toml or to DRAINBOARD_MODEL_ROOTS ({os.pathsep}-separated) "
                         f"and restart the worker and the dashboard")
