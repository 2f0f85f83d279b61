"""A process that must not outlive the one that started it (job children, relays, the ranks of a parallel run)."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1

try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when the thread that started it exits."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
