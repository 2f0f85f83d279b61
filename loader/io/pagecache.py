"""The page cache under a checkpoint: how much of a file is resident, dropping it, MemFree.

On unified memory (a DGX Spark) a checkpoint left in the page cache makes
the box look that much fuller to every CUDA program, because CUDA's free
figure follows MemFree. `stream` uses `sampled_resident_fraction` to read cold files
with O_DIRECT (nothing enters the cache) and `drop` to give back the ranges it
has read when asked to (`drop_page_cache`).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterable

_libc = ctypes.CDLL(None, use_errno=True)  # the C library is already in the process: no ldconfig run to find it
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value
_LOW_BIT = bytes(i & 1 for i in range(256))
"""mincore sets bit 0 of a page's byte when it is resident; the other bits are reserved."""


def resident_pages(fd: int, start: int = 0, length: int | None = None) -> tuple[int, int]:
    """(pages of [start, start + length) of `fd` in the page cache, pages in the range), by mincore.

    The file is mapped only to ask: no page is touched, so asking faults
    nothing in and the process's resident set does not grow.
    """
    size = os.fstat(fd).st_size
    end = size if length is None else min(size, start + length)
    lo = start - start % mmap.PAGESIZE
    if end <= lo:
        return 0, 0
    with _Mapping(fd, lo, end - lo) as mapped:
        return mapped.resident(0, end - lo)


def resident_fraction(fd: int) -> float:
    """Share of `fd`'s pages in the page cache (1.0 for an empty file)."""
    resident, pages = resident_pages(fd)
    return resident / pages if pages else 1.0


def sampled_resident_fraction(fd: int, *, windows: int = 16, window_bytes: int = 1024 * 1024) -> float:
    """`resident_fraction` estimated from `windows` evenly spaced windows of the file (1.0 when empty).

    Asking mincore about every page of a 4 GiB shard took 45 ms on the H200
    host, long enough to stall a load that asks once per shard; 16 windows of
    1 MiB ask about 1/256 of it, which is plenty to tell a cold file from a
    cached one. The cost is per call: 64 windows of 256 KiB (the same share)
    took 3.5-6 ms for the ten shards of a 37.6 GiB model, all of it before
    the CUDA ring's first read.
    """
    size = os.fstat(fd).st_size
    if size <= windows * window_bytes:
        return resident_fraction(fd)
    page = mmap.PAGESIZE
    stride = (size - window_bytes) // (windows - 1)
    resident = pages = 0
    with _Mapping(fd, 0, size) as mapped:
        for k in range(windows):
            at = k * stride - (k * stride) % page
            r, n = mapped.resident(at, window_bytes)
            resident, pages = resident + r, pages + n
    return resident / pages


class _Mapping:
    """A read-only mapping of [offset, offset + span) of `fd`, made only to ask mincore about it."""

    def __init__(self, fd: int, offset: int, span: int):
        self._span = span
        self._address = _libc.mmap(None, span, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
        if self._address in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap for mincore failed: {os.strerror(err)}")

    def resident(self, at: int, length: int) -> tuple[int, int]:
        """(resident pages, pages) of [at, at + length) of the mapping; `at` on a page boundary."""
        length = min(length, self._span - at)
        pages = -(-length // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        if _libc.mincore(self._address + at, length, vec) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mincore failed: {os.strerror(err)}")
        return bytes(vec).translate(_LOW_BIT).count(1), pages

    def __enter__(self) -> "_Mapping":
        return self

    def __exit__(self, *exc) -> None:
        _libc.munmap(self._address, self._span)


def files_resident_fraction(files: Iterable[str | os.PathLike]) -> float:
    """Share of the pages of all `files` together that sit in the page cache (1.0 when they are empty)."""
    resident = pages = 0
    for file in files:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            r, n = resident_pages(fd)
        finally:
            os.close(fd)
        resident, pages = resident + r, pages + n
    return resident / pages if pages else 1.0


def drop(fd: int, start: int = 0, length: int = 0) -> None:
    """Ask the kernel to drop [start, start + length) of `fd` from the page cache (0 = to the end).

    Clean pages go at once; dirty ones (a file still being written) stay until written back.
    """
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)


def mem_free() -> int:
    """MemFree of the machine in bytes (page cache does not count as free here, unlike MemAvailable)."""
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"MemFree:"):
                return int(line.split()[1]) * 1024
    return 0
