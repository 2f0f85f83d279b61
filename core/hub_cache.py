"""The Hugging Face cache's layout, where users' downloads already are (standard library only).

`hf download MiniMaxAI/MiniMax-H3` fills `<hub>/models--MiniMaxAI--MiniMax-H3/`: the files under
`snapshots/<revision>/` are relative links into the repository's own `blobs/`, and `refs/main` holds the
revision `main` points at. These facts are shared by the model-root check (a snapshot's link into its own
repository stays inside a root, `loader.roots`), the settings (the cache is a model root by default,
`storage.config`) and every place that names a model (`MiniMaxAI/MiniMax-H3 @ main`).
Nothing here contacts the hub.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

REPO_PREFIX = "models--"
"""A model repository's folder name in the cache: `models--<org>--<name>`."""
SNAPSHOTS, BLOBS, REFS = "snapshots", "blobs", "refs"
MAX_REF_BYTES = 256
"""A ref file holds one commit hash; anything longer is not read as one."""


def hub_cache_folder(env: Mapping[str, str] | None = None) -> Path:
    """Where huggingface_hub keeps its cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
    `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub` (huggingface_hub's own order)."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    cache = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path("~/.cache").expanduser()
    return cache / "huggingface" / "hub"


@dataclass(frozen=True)
class HubSnapshot:
    """One downloaded revision of a repository in the cache."""

    repo_id: str
    """`MiniMaxAI/MiniMax-H3`."""
    revision: str
    """The snapshot folder's name (a commit hash)."""
    repo_folder: Path
    """`<hub>/models--MiniMaxAI--MiniMax-H3`."""

    @property
    def folder(self) -> Path:
        return self.repo_folder / SNAPSHOTS / self.revision

    @property
    def label(self) -> str:
        """`MiniMaxAI/MiniMax-H3 @ main` when a ref names this revision, else `@ <first 12 hex digits>`."""
        return f"{self.repo_id} @ {self.ref_name() or self.revision[:12]}"

    def ref_name(self) -> str | None:
        """The ref (`main`, a tag) whose file holds this revision, if any (each ref file read bounded)."""
        refs = self.repo_folder / REFS
        try:
            names = sorted(p for p in refs.rglob("*") if p.is_file() and not p.is_symlink())
        except OSError:
            return None
        for path in names:
            try:
                with open(path, "rb") as f:
                    if f.read(MAX_REF_BYTES).strip() == self.revision.encode():
                        return path.relative_to(refs).as_posix()
            except OSError:
                continue
        return None


def repo_id_of(folder_name: str) -> str | None:
    """`MiniMaxAI/MiniMax-H3` for `models--MiniMaxAI--MiniMax-H3`; None for any other name."""
    if not folder_name.startswith(REPO_PREFIX) or len(folder_name) == len(REPO_PREFIX):
        return None
    return folder_name[len(REPO_PREFIX):].replace("--", "/")


def snapshot_of(path: str | os.PathLike) -> HubSnapshot | None:
    """The snapshot `path` is in or is (`<repo>/snapshots/<revision>[/...]`), read from the path's own parts
    (no link followed); None outside a cache's layout."""
    parts = Path(path).parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == SNAPSHOTS and repo_id_of(parts[i - 1]) is not None:
            return HubSnapshot(repo_id_of(parts[i - 1]), parts[i + 1], Path(*parts[:i]))
    return None


def link_root(path: str | os.PathLike) -> Path | None:
    """The repository folder a snapshot's link may lead into: where `path` sits in a snapshot (its folder,
    links resolved) and its target (links resolved) stays inside the same `models--*` folder. None
    otherwise: a link out of the repository, or a path in no snapshot."""
    named = Path(path)
    snapshot = snapshot_of(os.path.realpath(named.parent))
    if snapshot is None:
        return None
    repo = snapshot.repo_folder
    real = Path(os.path.realpath(named))
    return repo if repo in real.parents else None


def model_label(path: str | os.PathLike) -> str:
    """How a model is named to a user: `MiniMaxAI/MiniMax-H3 @ main` for a hub snapshot (or a file in one),
    else the path."""
    snapshot = snapshot_of(path)
    if snapshot is None:
        return str(path)
    inside = Path(path).relative_to(snapshot.folder) if Path(path) != snapshot.folder else None
    return snapshot.label + (f" ({inside.as_posix()})" if inside else "")


def holding_root(real: str | os.PathLike) -> Path:
    """The folder to add as a model root so that `real` (a resolved path) lies under it: the cache holding
    a repository, for anything inside one; else the folder above it."""
    real = Path(real)
    for folder in (real, *real.parents):
        if repo_id_of(folder.name) is not None:
            return folder.parent
    return real.parent
