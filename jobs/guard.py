"""The memory guard: the supervisor's own watch on the machine's memory while a job runs.

A cgroup limit does not see CUDA allocations on a unified-memory device (one
report: cgroup usage 33.9 GiB while the box used 115 GiB), and such a host can
freeze with no OOM kill at all. MemAvailable does see them: system in use =
MemTotal - MemAvailable. So the supervisor reads /proc/meminfo on a thread of
its own, 20 times a second (the child may be stuck in one long copy), and stops
the job (SIGTERM, SIGKILL after a short grace) when either limit is crossed:

- budget: the most the job may add to system in use over its start (the
  reading when the child reports its start, after its imports), the "pretend
  this box has less memory" that works for GPU jobs too;
- floor: the least MemAvailable the machine may be left with; by default
  `max(4 GiB, 5 % of MemTotal)` where the GPU shares host memory, off elsewhere.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable

from core.sizes import format_size
from storage.config import Config, memory_floor_setting

GUARD_INTERVAL = 0.05
"""Seconds between meminfo readings (20 a second)."""
GUARD_GRACE = 2.0
"""Seconds between the guard's SIGTERM and its SIGKILL."""
FLOOR_MINIMUM_DEFAULT = 4 * 2**30
"""The default floor is at least this, where a floor applies by default."""
FLOOR_FRACTION_DEFAULT = 0.05
"""... and at least this fraction of MemTotal."""


@dataclass(frozen=True)
class Meminfo:
    """One reading of /proc/meminfo, in bytes."""

    total: int
    """MemTotal."""
    available: int
    """MemAvailable: what the kernel can hand out without swapping (page cache counts as free)."""

    @property
    def in_use(self) -> int:
        """System in use: MemTotal - MemAvailable (CUDA allocations on unified memory included)."""
        return self.total - self.available


def read_meminfo(path: str = "/proc/meminfo") -> Meminfo:
    """MemTotal and MemAvailable now."""
    values = {}
    with open(path, "rb") as f:
        for line in f:
            key, _, rest = line.partition(b":")
            if key in (b"MemTotal", b"MemAvailable"):
                values[key] = int(rest.split()[0]) * 1024
                if len(values) == 2:
                    break
    return Meminfo(values[b"MemTotal"], values[b"MemAvailable"])


@dataclass(frozen=True)
class GuardLimits:
    """What the guard enforces for one job; None turns a limit off."""

    budget: int | None = None
    """Most bytes the job may add to system in use over its start."""
    floor: int | None = None
    """Least MemAvailable, in bytes."""

    @property
    def active(self) -> bool:
        return self.budget is not None or self.floor is not None


def default_floor(total: int) -> int:
    """The floor where the GPU shares host memory: max(4 GiB, 5 % of MemTotal)."""
    return max(FLOOR_MINIMUM_DEFAULT, int(total * FLOOR_FRACTION_DEFAULT))


def configured_floor(config: Config) -> int | str | None:
    """The configured floor: bytes, None for off, or "auto" (the default) for `default_floor` on unified memory.

    Raises `ConfigError` naming the setting (`load_config` already refused a bad one).
    """
    return memory_floor_setting(config.memory_floor)


def job_limits(budget: int | None, floor: int | None, config: Config, *, unified: bool, total: int) -> GuardLimits:
    """The limits of one job: its spec's budget; its spec's floor, else the configured one (auto: the
    default floor on a unified-memory machine, none elsewhere)."""
    if floor is None:
        setting = configured_floor(config)
        floor = (default_floor(total) if unified else None) if setting == "auto" else setting
    return GuardLimits(budget=budget, floor=floor)


def spec_limits(budget: int | None, floor: int | None, config: Config, *,
                read: Callable[[], Meminfo] = read_meminfo) -> GuardLimits:
    """`job_limits` for a spec's budget and floor on this machine (the unified-memory probe only when it matters)."""
    unified = floor is None and (config.memory_floor or "auto").strip().lower() == "auto" \
        and host_has_unified_memory()
    return job_limits(budget, floor, config, unified=unified, total=read().total)


@dataclass(frozen=True)
class GuardTrip:
    """The moment a limit was crossed."""

    reason: str
    """"budget" or "floor"."""
    limits: GuardLimits
    """The limits in force."""
    message: str
    """What was crossed, e.g. "system in use grew 412 MiB over the job's start, budget 400 MiB"."""
    at: float
    """When, on the guard's clock (monotonic by default)."""
    start: Meminfo
    """The reading at the job's start."""
    reading: Meminfo
    """The reading that crossed the limit."""
    sample: dict | None
    """The job's last memory sample at that moment (what the report quotes)."""

    def to_dict(self) -> dict:
        return {"reason": self.reason, "budget": self.limits.budget, "floor": self.limits.floor,
                "growth": self.reading.in_use - self.start.in_use,
                "in_use": self.reading.in_use, "start_in_use": self.start.in_use,
                "mem_available": self.reading.available, "mem_total": self.reading.total}


class MemoryGuard:
    """Watches one job: reads meminfo every `interval` s on its own thread, and on a crossed limit
    calls `send(SIGTERM)`, then `send(SIGKILL)` after `grace` s unless stopped first.

    `read` returns a `Meminfo` and `now` the clock (tests pass fakes); `snapshot`
    returns the job's last sample, kept with the trip. The floor holds from the
    start; the budget from `begin()`, which takes the start reading (the
    supervisor calls it when the child reports its start).
    """

    def __init__(
        self,
        limits: GuardLimits,
        send: Callable[[int], None],
        *,
        read: Callable[[], Meminfo] = read_meminfo,
        now: Callable[[], float] = time.monotonic,
        snapshot: Callable[[], dict | None] = lambda: None,
        interval: float = GUARD_INTERVAL,
        grace: float = GUARD_GRACE,
    ):
        self.limits = limits
        self._send = send
        self._read = read
        self._now = now
        self._snapshot = snapshot
        self._interval = interval
        self._grace = grace
        self.start_reading = read()
        self._begun = False
        self.trip: GuardTrip | None = None
        """Set when a limit was crossed."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="drainboard-memory-guard", daemon=True)

    def begin(self) -> None:
        """The job has started: take the reading its budget counts from."""
        self.start_reading = self._read()
        self._begun = True

    def check(self, reading: Meminfo) -> GuardTrip | None:
        """The trip `reading` causes, or None."""
        growth = reading.in_use - self.start_reading.in_use
        if self.limits.budget is not None and self._begun and growth > self.limits.budget:
            return self._trip("budget", f"system in use grew {format_size(growth)} over the job's start, "
                                        f"budget {format_size(self.limits.budget)}", reading)
        if self.limits.floor is not None and reading.available < self.limits.floor:
            return self._trip("floor", f"MemAvailable fell to {format_size(reading.available)}, floor "
                                       f"{format_size(self.limits.floor)} (system in use grew "
                                       f"{format_size(growth)} over the job's start)", reading)
        return None

    def _trip(self, reason: str, message: str, reading: Meminfo) -> GuardTrip:
        return GuardTrip(reason, self.limits, message, self._now(), self.start_reading, reading, self._snapshot())

    def start(self) -> "MemoryGuard":
        self._thread.start()
        return self

    def poll(self) -> GuardTrip | None:
        """One reading, what the thread takes every `interval`: a crossed limit is kept as `trip` and the child
        sent SIGTERM. Returns the trip, None while within limits."""
        trip = self.check(self._read())
        if trip is not None:
            self.trip = trip
            self._send(signal.SIGTERM)
        return trip

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if self.poll() is None:
                continue
            if not self._stop.wait(self._grace):
                self._send(signal.SIGKILL)
            return

    def stop(self) -> None:
        """Stop watching (the child has exited); waits for the thread."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()


def host_has_unified_memory() -> bool:
    """Whether this machine's GPU shares host memory (probe of `cuda`, `DRAINBOARD_UNIFIED_MEMORY` honoured)."""
    from machine.device import probe_device

    info = probe_device("cuda", environ=os.environ)
    return info.unified_memory and info.source != "probe-failed"
