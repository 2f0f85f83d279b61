"""The machine's memory as the kernel reports it: /proc/meminfo totals (the one pool
on unified memory) and memory pressure from /proc/pressure/memory (PSI)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dashboard import format as fmt
from machine.device import DeviceInfo

MEMINFO = Path("/proc/meminfo")
PRESSURE = Path("/proc/pressure/memory")


@dataclass(frozen=True)
class HostMemory:
    """Totals of /proc/meminfo, in bytes."""

    total: int
    """MemTotal."""
    free: int
    """MemFree: pages nobody uses, not even the page cache. CUDA's free figure on
    unified memory follows this one, so page cache reads as used there."""
    available: int
    """MemAvailable: what can be allocated without swapping (counts reclaimable page cache)."""
    cached: int
    """Cached: page cache, including mmap'd checkpoint shards."""
    swap_total: int
    """SwapTotal."""
    swap_free: int
    """SwapFree."""

    @property
    def in_use(self) -> int:
        """MemTotal − MemAvailable: system in use, the pressure on the pool."""
        return self.total - self.available

    @property
    def reclaimable(self) -> int:
        """MemAvailable − MemFree: what the kernel can hand out by dropping cache (mostly page cache)."""
        return max(self.available - self.free, 0)

    @property
    def swap_used(self) -> int:
        return self.swap_total - self.swap_free


_FIELDS = {
    "MemTotal": "total", "MemFree": "free", "MemAvailable": "available", "Cached": "cached",
    "SwapTotal": "swap_total", "SwapFree": "swap_free",
}


def parse_meminfo(text: str) -> HostMemory:
    """HostMemory from the text of /proc/meminfo; a missing field raises naming it."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in _FIELDS:
            values[_FIELDS[key]] = int(rest.split()[0]) * 1024
    missing = [k for k, v in _FIELDS.items() if v not in values]
    if missing:
        raise ValueError(f"/proc/meminfo lacks {', '.join(missing)}")
    return HostMemory(**values)


def read_host_memory(path: Path = MEMINFO) -> HostMemory:
    return parse_meminfo(path.read_text())


@dataclass(frozen=True)
class Pressure:
    """Memory pressure stall information (PSI): the share of wall time tasks waited for memory."""

    some_avg10: float
    """Percent of the last 10 s in which at least one task stalled on memory."""
    full_avg10: float
    """Percent of the last 10 s in which every non-idle task stalled on memory at once."""
    some_avg60: float
    """As some_avg10 over the last 60 s."""
    full_avg60: float
    """As full_avg10 over the last 60 s."""


def parse_pressure(text: str, *, source: str = str(PRESSURE)) -> Pressure:
    """Pressure from PSI text ("some avg10=0.12 avg60=… total=…" and a "full" line);
    a malformed file raises naming the file and what was expected."""
    lines: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        lines[kind] = dict(pair.partition("=")[::2] for pair in pairs)
    try:
        return Pressure(
            some_avg10=float(lines["some"]["avg10"]), full_avg10=float(lines["full"]["avg10"]),
            some_avg60=float(lines["some"]["avg60"]), full_avg60=float(lines["full"]["avg60"]),
        )
    except (KeyError, ValueError) as e:
        raise ValueError(f"{source}: expected 'some' and 'full' lines with avg10= and avg60=, got {text[:120]!r}") from e


def read_pressure(path: Path | None = None) -> Pressure | None:
    """PSI of the memory resource (`path` defaults to PRESSURE, read when called), or None where the
    kernel does not provide it (built without CONFIG_PSI, booted with psi=0, or an older kernel)."""
    path = path or PRESSURE
    try:
        text = path.read_text()
    except OSError:
        return None
    return parse_pressure(text, source=str(path))


def memory_kind(device: DeviceInfo) -> str:
    """What memory a device's jobs use: "host memory" for the CPU, "unified memory"
    for an integrated GPU or MPS, "discrete memory" for a GPU with its own."""
    if device.kind == "cpu":
        return "host memory"
    return "unified memory" if device.unified_memory else "discrete memory"


def is_unified(devices: Sequence[DeviceInfo]) -> bool:
    """True when a probed GPU (CUDA or MPS) shares the host's memory."""
    return any(d.kind != "cpu" and d.unified_memory for d in devices)


def pool_caption(devices: Sequence[DeviceInfo]) -> str:
    """What the frame's memory bar is: the pool GPU and CPU share when a probed GPU
    (CUDA or MPS) is unified, else just host memory (no GPU, or a discrete one)."""
    return "unified memory: GPU and CPU share this pool" if is_unified(devices) else "host memory"


def cuda_free_note(host: HostMemory) -> str:
    """The line unified-memory users need: why CUDA says less is free than really is."""
    return (
        f"On unified memory CUDA's free figure (cudaMemGetInfo) follows MemFree ({fmt.gib(host.free)}), so page cache"
        f" counts as used there; MemAvailable ({fmt.gib(host.available)}) is what a job can still allocate."
    )
