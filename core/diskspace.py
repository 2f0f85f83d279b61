"""Free space on the filesystem a write goes to, and recognising a full disk.

Writers that know their size up front (synthetic checkpoints) refuse before the
first byte; every writer turns ENOSPC into a `DiskFullError` naming its file.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from .errors import DiskFullError

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes free for an unprivileged writer on the filesystem `path` is (or would be created) on."""
    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def require_space(folder: str | os.PathLike, needed: int, what: str) -> None:
    """Raise DiskFullError when `folder`'s filesystem has fewer than `needed` bytes free for `what`."""
    free = free_bytes(folder)
    if free < needed:
        raise DiskFullError(f"not enough disk space in {folder}: {what} needs {needed:,} bytes, {free:,} bytes free")


def is_disk_full(exc: BaseException) -> bool:
    """True for an OS error saying the disk (or the user's quota) is full, PyAV's included."""
    return isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS
