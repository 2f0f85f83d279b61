"""Positioned reads of a file's byte range straight into a tensor's memory.

`read_into` is the primitive every streaming path uses (and the sharded
loader reuses to read slices): no mmap, no intermediate Python bytes, the
GIL released during the read so two threads can read in parallel.
"""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import Executor, Future
from pathlib import Path

import torch

from core.errors import CheckpointError

_MAX_READ = 0x7FFFF000
"""Linux transfers at most this many bytes per read call."""
_PART_ALIGN = 2 * 1024 * 1024
"""Parallel parts start on 2 MiB boundaries of the destination."""
_ADVICE_MAX = 2 * 1024 * 1024
_ADVICE_DEFAULT = 256 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE")
_MADV_POPULATE_WRITE = 23
"""Linux >= 5.14: fault a writable range in with one call."""
_libc = ctypes.CDLL(None, use_errno=True)  # the C library is already in the process: no ldconfig run to find it
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable memoryview over a contiguous CPU tensor's bytes (any dtype, pinned or not)."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError(f"need a contiguous CPU tensor, got {tensor.device} contiguous={tensor.is_contiguous()}")
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return memoryview(bytearray(0))
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


def read_into(fd: int, offset: int, dest: torch.Tensor | memoryview, *, name: str = "") -> int:
    """Fill `dest` (a contiguous CPU tensor or a writable buffer) from `fd` at `offset`.

    Loops over short reads; a file that ends early raises CheckpointError
    naming `name` (the file, the tensor) so truncation is one clear line.
    """
    view = dest if isinstance(dest, memoryview) else byte_view(dest)
    done, total = 0, len(view)
    while done < total:
        n = os.preadv(fd, [view[done : done + min(total - done, _MAX_READ)]], offset + done)
        if n == 0:
            raise CheckpointError(
                f"{name or f'fd {fd}'}: file ended after {done} of {total} bytes at offset {offset} (truncated?)"
            )
        done += n
    return done


def submit_parts(
    fd: int, offset: int, dest: torch.Tensor | memoryview, pool: Executor | None, *, parts: int, name: str = ""
) -> list[Future]:
    """Queue `read_into` of `dest` split in up to `parts` contiguous pieces on `pool`; returns their futures.

    Without a pool (or for one part) the read happens here and the list is empty,
    so callers wait on the futures either way without caring which it was.
    """
    view = dest if isinstance(dest, memoryview) else byte_view(dest)
    total = len(view)
    if pool is None or parts < 2 or total < 2 * _PART_ALIGN:
        if pool is None:
            read_into(fd, offset, view, name=name)
            return []
        return [pool.submit(read_into, fd, offset, view, name=name)]
    step = -(-total // parts)
    step += -step % _PART_ALIGN
    return [pool.submit(read_into, fd, offset + start, view[start : start + step], name=name) for start in range(0, total, step)]


def advise_willneed(fd: int, start: int, end: int, step: int) -> None:
    """Ask the kernel to start reading [start, end) of `fd` into the page cache, without waiting.

    The kernel honours at most its readahead limit per call (max of the
    device's max_sectors_kb and the file's readahead window), so the range is
    asked for in `step`-sized calls; see `advice_step`.
    """
    for lo in range(start, end, step):
        os.posix_fadvise(fd, lo, min(step, end - lo), os.POSIX_FADV_WILLNEED)


def advice_step(fd: int) -> int:
    """Bytes one POSIX_FADV_WILLNEED call on `fd` really schedules, from the block device's queue limits.

    That is max(max_sectors_kb, 2 x read_ahead_kb): the doubling is what
    POSIX_FADV_SEQUENTIAL gives the file's window. Capped at 2 MiB (the kernel
    works in 2 MiB pieces anyway); where the device is not a block device
    with a queue (overlayfs, tmpfs) 256 KiB, the common default's value.
    """
    dev = os.fstat(fd).st_dev
    base = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for queue in (base / "queue", base / ".." / "queue"):
        try:
            sectors = int((queue / "max_sectors_kb").read_text())
            ahead = int((queue / "read_ahead_kb").read_text())
        except (OSError, ValueError):
            continue
        return max(4096, min(_ADVICE_MAX, max(sectors, 2 * ahead) * 1024))
    return _ADVICE_DEFAULT


def read_into_fresh(fd: int, offset: int, dest: memoryview, *, name: str = "") -> int:
    """`read_into` a destination never touched before, faulting its pages in first with one call.

    Faulting in fresh memory one 4 KiB trap at a time, not the copy, is the
    wall when reading into new tensors (measured on the 2-core VM: 3.8 GB/s
    with per-page faults, 4.4-4.6 GB/s, the raw read rate, after
    MADV_POPULATE_WRITE). Where the kernel lacks it, the read faults as usual.
    """
    populate(dest)
    return read_into(fd, offset, dest, name=name)


def populate(view: memoryview) -> bool:
    """Fault in the pages under a writable buffer (MADV_POPULATE_WRITE); whether the kernel did."""
    if len(view) == 0:
        return False
    address = ctypes.addressof(ctypes.c_char.from_buffer(view))
    start = address & ~(_PAGE - 1)
    return _libc.madvise(start, address + len(view) - start, _MADV_POPULATE_WRITE) == 0
