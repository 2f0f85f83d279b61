"""Hand freed host buffers back to the OS at once, so a process's resident set follows its live tensors.

glibc serves allocations under its mmap threshold from heaps it keeps mapped after they are freed, and
raises that threshold (up to 32 MiB) each time a large mapped buffer is freed. A generate run frees many
1-32 MiB temporaries (activations, decoded frames' copies); with the sliding threshold whether their pages
stay resident depends on the order of earlier frees, so the same job's stage peaks moved by tens of MiB
from run to run, and on a unified-memory machine those retained pages are memory the GPU cannot have.
A fixed threshold maps every buffer above it on its own and unmaps it on free. What stays on the heaps
(tensors under the threshold: a released component's norms and biases, thousands of them in a small model)
goes back when a component is released, by `give_back_free_heap`: glibc only trims a heap from its top, so
one live allocation above the freed ones kept them all resident, or not, from one run to the next.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

MMAP_THRESHOLD_BYTES = 1 << 20
"""Allocations from this size up get their own mapping, returned to the OS when freed."""
_M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameter number (malloc.h)."""


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """glibc, or None where the C library is another (nothing is tuned there)."""
    return ctypes.CDLL(ctypes.util.find_library("c")) if platform.libc_ver()[0] == "glibc" else None


@functools.cache
def return_large_frees_to_os() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD_BYTES for this process; False where the C library is not
    glibc (nothing changes there). Once per process."""
    libc = _libc()
    if libc is None:
        return False
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1


def give_back_free_heap() -> bool:
    """Hand the free pages inside every heap back to the OS (glibc's `malloc_trim(0)`, which releases free
    pages anywhere in a heap, not only at its top); True if any went back. Meant for after a release: it walks
    every arena, milliseconds on a large heap."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc.malloc_trim(0) == 1
