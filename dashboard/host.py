"""The machine's memory totals, read from /proc/meminfo (the one pool on unified memory)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from loader.device import DeviceInfo


@dataclass(frozen=True)
class HostMemory:
    """Totals of /proc/meminfo, in bytes."""

    total: int
    """MemTotal."""
    available: int
    """MemAvailable: what can be allocated without swapping (counts clean page cache)."""
    cached: int
    """Cached: page cache, including mmap'd checkpoint shards."""
    swap_total: int
    """SwapTotal."""
    swap_free: int
    """SwapFree."""

    @property
    def in_use(self) -> int:
        """MemTotal − MemAvailable: pressure on the pool."""
        return self.total - self.available

    @property
    def swap_used(self) -> int:
        return self.swap_total - self.swap_free


_FIELDS = {"MemTotal": "total", "MemAvailable": "available", "Cached": "cached", "SwapTotal": "swap_total", "SwapFree": "swap_free"}


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


def read_host_memory(path: Path = Path("/proc/meminfo")) -> HostMemory:
    return parse_meminfo(path.read_text())


def memory_kind(device: DeviceInfo) -> str:
    """What memory a device's jobs use: "host memory" for the CPU, "unified memory"
    for an integrated GPU or MPS, "discrete memory" for a GPU with its own."""
    if device.kind == "cpu":
        return "host memory"
    return "unified memory" if device.unified_memory else "discrete memory"


def pool_caption(devices: Sequence[DeviceInfo]) -> str:
    """What the frame's memory bar is: the pool GPU and CPU share when a probed GPU
    (CUDA or MPS) is unified, else just host memory (no GPU, or a discrete one)."""
    if any(d.kind != "cpu" and d.unified_memory for d in devices):
        return "unified memory: GPU and CPU share this pool"
    return "host memory"
