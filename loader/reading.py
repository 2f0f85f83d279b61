"""Positioned reads of a file's byte range straight into a tensor's memory.

`read_into` is the primitive every streaming path uses (and the sharded
loader reuses to read slices): no mmap, no intermediate Python bytes, the
GIL released during the read so two threads can read in parallel.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from concurrent.futures import Executor

import torch

from .errors import CheckpointError

_MAX_READ = 0x7FFFF000
"""Linux transfers at most this many bytes per read call."""
_HUGE_PAGE = 2 * 1024 * 1024
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
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


def read_parallel(
    fd: int, offset: int, dest: torch.Tensor | memoryview, pool: Executor | None, *, parts: int, name: str = ""
) -> None:
    """`read_into` split in `parts` contiguous pieces read concurrently on `pool`."""
    view = dest if isinstance(dest, memoryview) else byte_view(dest)
    total = len(view)
    if pool is None or parts < 2 or total < 2 * _HUGE_PAGE:
        read_into(fd, offset, view, name=name)
        return
    step = -(-total // parts)
    step += -step % _HUGE_PAGE
    futures = [
        pool.submit(read_into, fd, offset + start, view[start : start + step], name=name)
        for start in range(0, total, step)
    ]
    for f in futures:
        f.result()


def advise_huge_pages(tensor: torch.Tensor) -> bool:
    """Ask for transparent huge pages under a fresh CPU tensor before it is first touched.

    Faulting in 4 KiB pages, not the read, is the wall when reading into
    fresh memory; huge pages make the destination as fast to fill as a
    reused buffer. Only the 2 MiB-aligned interior can be advised. Returns
    whether the kernel accepted the advice.
    """
    nbytes = tensor.numel() * tensor.element_size()
    start = tensor.data_ptr()
    aligned = (start + _HUGE_PAGE - 1) & ~(_HUGE_PAGE - 1)
    end = (start + nbytes) & ~(_HUGE_PAGE - 1)
    if tensor.device.type != "cpu" or end <= aligned:
        return False
    return _libc.madvise(aligned, end - aligned, _MADV_HUGEPAGE) == 0
