"""The shard files one `stream` load reads: descriptors, read-ahead advice, O_DIRECT, page-cache drops."""

from __future__ import annotations

import fcntl
import mmap
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..io import pagecache
from ..metadata import TensorMeta
from ..confined import CheckedFile, reopen
from ..io.reading import advice_step, advise_willneed
from core.errors import CheckpointError
from .base import LoadPlan
from .chunk_reads import FileHandles

COLD_BELOW = 0.5
"""A file with less than this share of its pages in the page cache is read with O_DIRECT (when allowed)."""


def plan_files(plan: LoadPlan) -> dict[Path, CheckedFile | None]:
    """Every shard `plan` reads, with what discovery validated of it (None for a hand-built one)."""
    return {meta.file: meta.checked for planned in plan.targets for meta in planned.sources}


def sampled_residency(files: Mapping[Path, CheckedFile | None] | Iterable[Path]) -> dict[Path, tuple[float, int]]:
    """Per file that can be opened (reading the others fails later, by name): the share of its pages
    in the page cache, sampled (`pagecache.sampled_resident_fraction`), and its page count. Files
    come with what discovery validated of them (`plan_files`), or as bare paths (a forecast)."""
    residency = {}
    pairs = files.items() if isinstance(files, Mapping) else ((file, None) for file in files)
    for file, checked in pairs:
        try:
            fd = reopen(file, checked)
        except CheckpointError:
            continue
        try:
            residency[file] = (pagecache.sampled_resident_fraction(fd), -(-os.fstat(fd).st_size // mmap.PAGESIZE))
        except OSError:
            pass  # not measurable (mincore refused): left to the check at its first read
        finally:
            os.close(fd)
    return residency


def mostly_uncached(residency: Mapping[Path, tuple[float, int]]) -> bool:
    """Whether most of the pages `sampled_residency` measured are out of the page cache."""
    pages = sum(n for _, n in residency.values())
    return pages > 0 and sum(share * n for share, n in residency.values()) < COLD_BELOW * pages


class OpenFiles(FileHandles):
    """File descriptors opened on first use and closed after the last planned read from them.

    Also remembers how far ahead the kernel was already asked to read each
    file (`ahead`), which files are read with O_DIRECT (`fd_for`), and drops
    what was read from the page cache when asked to (`drop_page_cache`).
    """

    def __init__(
        self, plan: LoadPlan, readahead: int, *, direct_io: bool | None = False, drop_page_cache: bool = False,
        residency: Mapping[Path, tuple[float, int]] | None = None,
    ):
        self._remaining: dict[Path, int] = {}
        self._checked = plan_files(plan)
        """Per file, what discovery validated: every descriptor is opened through it (`confined`)."""
        for planned in plan.targets:
            for meta in planned.sources:
                self._remaining[meta.file] = self._remaining.get(meta.file, 0) + 1
        self._fds: dict[Path, int] = {}
        self._direct: dict[Path, int | None] = {}
        """Per file read in ranges: its O_DIRECT descriptor, or None where it is read buffered."""
        self._readahead = readahead
        self._advised: dict[Path, tuple[int, int]] = {}
        """Per open file, the byte range [start, end) already handed to POSIX_FADV_WILLNEED."""
        self._step = 0
        self._direct_io = direct_io
        """True: O_DIRECT wherever the file system takes it; None: only for files mostly not cached; False: never."""
        self.drop_page_cache = drop_page_cache
        """Drop every range from the page cache once read, and each whole file when closed."""
        self._residency = dict(residency or {})
        """Files already sampled (`sampled_residency`), so deciding O_DIRECT does not sample them again."""

    def fd(self, meta: TensorMeta) -> int:
        return self._open(meta.file)

    def _open(self, file: Path) -> int:
        fd = self._fds.get(file)
        if fd is None:
            fd = self._fds[file] = reopen(file, self._checked.get(file))
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return fd

    def fd_for(self, file: Path) -> tuple[int, bool]:
        if file not in self._direct:
            self._direct[file] = self._open_direct(file)
        direct = self._direct[file]
        return (direct, True) if direct is not None else (self._open(file), False)

    def _open_direct(self, file: Path) -> int | None:
        flag = getattr(os, "O_DIRECT", 0)
        if self._direct_io is False or not flag:
            return None
        if self._direct_io is None:
            known = self._residency.get(file)
            share = known[0] if known else pagecache.sampled_resident_fraction(self._open(file))
            if share >= COLD_BELOW:
                return None
        fd = reopen(file, self._checked.get(file))
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | flag)
        except OSError:
            os.close(fd)
            return None  # the file system refuses O_DIRECT (tmpfs before Linux 6.6, some FUSE): read buffered
        return fd

    def fallback(self, file: Path) -> int:
        direct = self._direct.get(file)
        if direct is not None:
            os.close(direct)
        self._direct[file] = None
        return self._open(file)

    def chunk_read(self, file: Path, offset: int, length: int) -> None:
        if self.drop_page_cache and length > 0:
            pagecache.drop(self._open(file), offset, length)

    def ahead(self, meta: TensorMeta, offset: int, length: int) -> None:
        """Before reading [offset, offset + length) of `meta`'s file, have the kernel fetch it and
        `readahead` bytes past it (only what earlier calls did not already cover)."""
        if self._readahead == 0 or not hasattr(os, "posix_fadvise"):
            return
        fd = self.fd(meta)
        if not self._step:
            self._step = advice_step(fd)
        start, end = self._advised.get(meta.file, (0, 0))
        if not start <= offset <= end:
            start = end = offset
        target = offset + length + self._readahead
        if target > end:
            advise_willneed(fd, end, target, self._step)
            self._advised[meta.file] = (start, target)

    def done(self, meta: TensorMeta) -> None:
        """Every byte of `meta` has been read: drop it if asked, close its file after its last source."""
        if self.drop_page_cache and meta.file in self._fds:
            pagecache.drop(self._fds[meta.file], meta.offset, meta.nbytes)
        self._remaining[meta.file] -= 1
        if self._remaining[meta.file] == 0:
            self._close(meta.file)

    def _close(self, file: Path) -> None:
        direct = self._direct.pop(file, None)
        if direct is not None:
            os.close(direct)
        fd = self._fds.pop(file, None)
        if self.drop_page_cache:
            if fd is None:  # read with O_DIRECT only: the header pages discovery read are still cached
                fd = reopen(file, self._checked.get(file))
            pagecache.drop(fd)
        if fd is not None:
            os.close(fd)
        self._advised.pop(file, None)

    def close_all(self) -> None:
        for file in set(self._fds) | set(self._direct):
            self._close(file)
        self._advised.clear()
