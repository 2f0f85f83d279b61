"""Hand freed host buffers back to the OS at once, so a process's resident set follows its live tensors.

glibc serves allocations under its mmap threshold from heaps it keeps mapped after they are freed, and
raises that threshold (up to 32 MiB) each time a large mapped buffer is freed. A generate run frees many
1-32 MiB temporaries (activations, decoded frames' copies); with the sliding threshold whether their pages
stay resident depends on the order of earlier frees, so the same job's stage peaks moved by tens of MiB
from run to run, and on a unified-memory machine those retained pages are memory the GPU cannot have.
A fixed threshold maps every buffer above it on its own and unmaps it on free.
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
def return_large_frees_to_os() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD_BYTES for this process; False where the C library is not
    glibc (nothing changes there). Once per process."""
    if platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
