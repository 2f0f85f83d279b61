"""A fixed mmap threshold returns freed mid-size buffers to the OS; glibc's sliding one keeps them resident.
Each case runs in a fresh process: the threshold is process-wide and cannot be unset."""

from __future__ import annotations

import ctypes.util
import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the threshold is glibc's")

_RETAINED_AFTER_FREE = """
import ctypes, sys
sys.path.insert(0, sys.argv[2])
from machine.host_heap import return_large_frees_to_os
libc = ctypes.CDLL(sys.argv[3])
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def anon():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("RssAnon"))
fixed = sys.argv[1] == "fixed" and return_large_frees_to_os()
MiB = 1 << 20
for _ in range(2):
    libc.free(libc.malloc(8 * MiB))  # freeing a mapped 8 MiB buffer slides glibc's threshold up to it
before, big, keep = anon(), [], []
for _ in range(64):
    big.append(libc.malloc(3 * MiB))
    libc.memset(big[-1], 1, 3 * MiB)
    keep.append(libc.malloc(1000))  # live blocks between them: the heap cannot shrink from its top
for p in big:
    libc.free(p)
print(int(fixed), anon() - before)
"""


def _retained(mode: str) -> tuple[bool, int]:
    run = subprocess.run([sys.executable, "-c", _RETAINED_AFTER_FREE, mode, str(Path(__file__).parents[2]),
                          ctypes.util.find_library("c")], capture_output=True, text=True, check=True, timeout=60)
    fixed, retained = run.stdout.split()
    return fixed == "1", int(retained)


def test_freed_3_mib_buffers_leave_nothing_resident_once_the_threshold_is_fixed():
    fixed, retained = _retained("fixed")
    assert fixed and retained < 8 * 2**20, retained


def test_without_it_glibc_keeps_the_same_frees_resident():
    """The case the fix is for, so the test above could fail: 64 x 3 MiB freed, nearly all still resident."""
    fixed, retained = _retained("plain")
    assert not fixed and retained > 150 * 2**20, retained
