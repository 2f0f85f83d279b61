"""Model roots: every file the loader opens must resolve (links followed) under one of them.

A checkpoint names files inside itself (index targets, component folders,
shards that may be links); without this check a crafted index could make a
load read any file the process can. The check runs before a file is opened,
and its message names the entry, never what the file holds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from core.errors import CheckpointError

RootsArg = Iterable[str | os.PathLike] | None
"""What `roots=` accepts: folders (resolved here), or None for the checkpoint's own root."""


class RootEscape(CheckpointError):
    """A file a checkpoint names resolves, or came to resolve, outside the model roots: always raised,
    never collected as one more problem of a checkpoint."""


class ModelRoots:
    """The resolved folders a load may read from."""

    def __init__(self, roots: Iterable[str | os.PathLike]):
        self.folders = tuple(Path(os.path.realpath(r)) for r in roots)
        if not self.folders:
            raise CheckpointError("no model roots given; every checkpoint file must lie under one")

    @classmethod
    def for_checkpoint(cls, path: str | os.PathLike, roots: RootsArg) -> ModelRoots:
        """`roots` as given, or the checkpoint's own root: the folder given, or a lone file's folder."""
        if roots is not None:
            return cls(roots)
        given = Path(path)
        return cls([given if given.is_dir() else given.parent])

    def contains(self, path: Path) -> bool:
        """Whether `path`, links resolved, lies under (or is) one of the roots."""
        real = Path(os.path.realpath(path))
        return any(real == root or root in real.parents for root in self.folders)

    def check(self, path: Path, entry: str) -> Path:
        """`path` unchanged if it resolves under a root, else a CheckpointError naming `entry`."""
        if not self.contains(path):
            raise RootEscape(f"{entry}: resolves outside the model roots ({self.describe()}); refused")
        return path

    def describe(self) -> str:
        return ", ".join(str(r) for r in self.folders)
