"""Is a process still there, and is it the one we started? Boot ids, zombies, recycled pids.

A supervisor decides from these whether a job's supervisor or child is gone;
`/proc` is read directly, so the answers are cheap enough for every tick.
"""

from __future__ import annotations

import os
from pathlib import Path

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
ENV_BOOT_ID = "DRAINBOARD_BOOT_ID"
"""Overrides the kernel's boot id (tests, containers that share the host's)."""


def boot_id(environ: os._Environ | dict | None = None) -> str:
    """This boot's id: changes with every host restart, so a job stored under another one died with the host."""
    environ = os.environ if environ is None else environ
    forced = environ.get(ENV_BOOT_ID, "").strip()
    if forced:
        return forced
    try:
        return BOOT_ID_FILE.read_text().strip()
    except OSError:
        return "unknown"


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat from the state on (the command name may hold spaces and parentheses)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def pid_alive(pid: int) -> bool:
    """True while process `pid` exists and is not a zombie (a zombie has exited; only its parent's wait is due)."""
    fields = _stat_fields(pid)
    if fields is not None:
        return fields[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None if it is gone.

    Stored with a job's pid, it tells the job's child from a later process that got the same pid.
    """
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def is_same_process(pid: int | None, start: int | None) -> bool:
    """True when `pid` is alive and still the process that started at `start` (unknown start: False)."""
    if not pid or start is None:
        return False
    return process_start(pid) == start and pid_alive(pid)
