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

from core.echo import echo_name
from core.errors import CheckpointError
from core.hub_cache import holding_root, link_root

RootsArg = Iterable[str | os.PathLike] | None
"""What `roots=` accepts: folders (resolved here), or None for the checkpoint's own root."""


class RootEscape(CheckpointError):
    """A file a checkpoint names resolves, or came to resolve, outside the model roots: always raised,
    never collected as one more problem of a checkpoint."""


class ModelRoots:
    """The resolved folders a load may read from.

    One exception to "links resolved under a root": a file in a Hugging Face cache snapshot under a root is
    a relative link into its repository's `blobs/`, usually outside the root (the snapshot folder given as
    the root, as `python -m loader inspect <snapshot>` does). Such a link counts as inside when its target
    stays in the same `models--*` repository folder (`core.hub_cache.link_root`); the file is then opened
    from that repository folder down, no link followed (`confined`). A link out of the repository is refused.
    """

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

    def locate(self, path: Path) -> Path | None:
        """The folder an open of `path` walks down from: the root it resolves under (links resolved), or
        the cache repository its snapshot link stays in while the link itself lies under a root; None
        when neither holds."""
        real = Path(os.path.realpath(path))
        root = next((r for r in self.folders if real == r or r in real.parents), None)
        if root is not None:
            return root
        folder = Path(os.path.realpath(Path(path).parent))
        if not any(folder == r or r in folder.parents for r in self.folders):
            return None
        return link_root(path)

    def contains(self, path: Path) -> bool:
        """Whether `path` lies under (or is) one of the roots, links resolved (see `locate`)."""
        return self.locate(path) is not None

    def check(self, path: Path, entry: str) -> Path:
        """`path` unchanged if it resolves under a root, else a CheckpointError naming `entry`."""
        if not self.contains(path):
            raise self.escape(path, entry)
        return path

    def escape(self, path: Path, entry: str) -> RootEscape:
        """The refusal of `path`: where it really is, which root would hold it and how to add one."""
        real = Path(os.path.realpath(path))
        where = "" if real == Path(path) else f" (it is {echo_name(real)})"
        holder = echo_name(holding_root(real))
        return RootEscape(f"{entry}: resolves outside the model roots ({self.describe()}){where}; refused. "
                          f"A root holding it: {holder} (python -m loader: --root {holder}; jobs and the "
                          f"dashboard: model_roots in drainboard.toml or DRAINBOARD_MODEL_ROOTS)")

    def describe(self) -> str:
        return ", ".join(str(r) for r in self.folders)
