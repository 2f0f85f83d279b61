"""How a helper process lives and ends: it must not outlive the one that started it (job children, relays,
the ranks of a parallel run), and a rank ends without the interpreter's teardown."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
import traceback
from typing import Callable, NoReturn

_PR_SET_PDEATHSIG = 1

try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when the thread that started it exits."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def exit_rank(main: Callable[[], int]) -> NoReturn:
    """Run one rank's `main` and end the process with its code, skipping the interpreter's teardown.

    A rank's results are on disk when `main` returns. What is left is finalization, where torch.distributed's
    C++ threads and Python's daemon threads are torn down in no fixed order. Once in many runs, that aborts
    a rank that had finished ("terminate called without an active exception"), and torchrun reports the
    whole run as failed. An exception still prints its traceback and exits 1.
    """
    try:
        code = main()
    except SystemExit as e:  # argparse's usage errors
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def wait_polling(poll: Callable[[], int | None], timeout: float | None, what: str, interval: float) -> int:
    """`subprocess.Popen.wait` for a process the caller can only `poll` (a forked child, a rank on another node):
    its exit code, or TimeoutExpired naming `what` after `timeout` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while (code := poll()) is None:
        if deadline is not None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(what, timeout)
        time.sleep(interval)
    return code
