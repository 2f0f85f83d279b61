"""Load report and metrics: each field's docstring below is its exact definition (all of them, with the forecast's, in docs/metrics.md)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from machine.memory import MemoryProbe, MemorySample
from .io.pagecache import mem_free


@dataclass(frozen=True)
class TensorPlaced:
    """Progress event: one destination tensor placed."""

    index: int
    """1-based count of tensors placed so far."""
    total: int
    """Tensors to place in this load."""
    name: str
    """Target name in the module."""
    nbytes: int
    """Bytes of this tensor in the target dtype."""
    bytes_placed: int
    """Bytes placed so far, this tensor included."""
    sample: MemorySample
    """The memory sample the loader took right after placing it (shared, one probe read)."""


@dataclass
class LoadReport:
    """What one load did and cost. Ratios are relative to `bytes_placed`."""

    mode: str
    """Placement mode (`stream`, `drain`, `retain`)."""
    device: str
    """Target device."""
    tensors_total: int = 0
    """Target tensors planned."""
    tensors_placed: int = 0
    """Target tensors written."""
    bytes_placed: int = 0
    """Sum of nbytes of every destination tensor written, in the target dtype."""
    bytes_read: int = 0
    """Checkpoint bytes read."""
    load_seconds: float = 0.0
    """First checkpoint read to last placement done (device synchronised)."""
    throughput_gbps: float = 0.0
    """bytes_read / load_seconds / 1e9."""
    footprint_ratio: float = 0.0
    """max over samples of ((VmRSS - base) + (device allocated - base)) / bytes_placed."""
    host_peak_ratio: float = 0.0
    """(max VmRSS - base VmRSS) / bytes_placed."""
    memavailable_cost_ratio: float = 0.0
    """(base MemAvailable - min MemAvailable) / bytes_placed."""
    peak_device_allocated_bytes: int = 0
    """Largest torch.cuda.memory_allocated seen during the load (0 off CUDA)."""
    samples: int = 0
    """Memory samples taken (baseline included)."""
    mem_free_before: int = 0
    """MemFree of the machine at the baseline (page cache counts as used here; on unified memory CUDA's free follows it)."""
    mem_free_after: int = 0
    """MemFree once the load finished."""
    page_cache_dropped: bool = False
    """Whether the placement dropped what it read from the page cache (`drop_page_cache`)."""
    ring_reader: str = ""
    """What read `stream`'s CUDA ring: "io_uring" or "threads" ("" when no ring ran)."""
    ring_reader_note: str = ""
    """Why the ring read with threads, where io_uring was refused, or why io_uring's kernel workers ran uncapped."""
    ring_copier: str = ""
    """What queued the ring's host-to-device copies: "driver" (cuMemcpyHtoDAsync) or "torch"."""
    ring_staging: str = ""
    """What the ring's host buffers were: "registered" (cuMemHostRegister), "torch-pinned" (torch's pinned
    allocator, where registration was refused, as on a GB10) or "pageable" (both refused)."""
    ring_staging_note: str = ""
    """Why the ring's buffers were not registered, where they were not."""
    host_pinned_bytes: int = 0
    """Bytes of page-locked host blocks the CPU destinations were carved from (`pin_host`; 0 without)."""
    host_pinned_note: str = ""
    """Why CPU destinations went to pageable memory despite `pin_host`, where some did."""
    loaded: list[str] = field(default_factory=list)
    """Target names placed."""
    missing: list[str] = field(default_factory=list)
    """Module tensors the checkpoint did not provide."""
    unexpected: list[str] = field(default_factory=list)
    """Target names the module has no tensor for (not read)."""
    skipped: list[str] = field(default_factory=list)
    """Checkpoint `*_extra_state` entries ignored on purpose."""
    excluded: list[str] = field(default_factory=list)
    """Checkpoint tensors the caller's `exclude` set aside: never read."""
    excluded_tensors: int = 0
    """How many tensors `excluded` names (a field, so `LoadReport(**to_dict())` round-trips)."""
    excluded_bytes: int = 0
    """Bytes on disk of the excluded tensors."""

    def to_dict(self) -> dict:
        return asdict(self)


class LoadMeter:
    """Takes the samples of one load and turns them into the report's metrics.

    `baseline()` must be called after the empty model exists and before the
    first checkpoint byte is read; `placed()` after each tensor.
    """

    def __init__(
        self,
        report: LoadReport,
        probe: MemoryProbe,
        on_tensor: Callable[[TensorPlaced], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.report = report
        self._probe = probe
        self._on_tensor = on_tensor
        self._clock = clock
        self._base: MemorySample | None = None
        self._start: float | None = None
        self._max_rss = 0
        self._max_footprint = 0
        self._min_available = 0
        self._max_device = 0

    def baseline(self) -> MemorySample:
        self.report.mem_free_before = mem_free()
        self._base = self._take()
        self._max_rss = self._base.vm_rss
        self._min_available = self._base.mem_available
        return self._base

    def start(self) -> None:
        """The first checkpoint read begins now."""
        if self._start is None:
            self._start = self._clock()

    def read(self, nbytes: int) -> None:
        self.report.bytes_read += nbytes

    def ring_ran(self, stats) -> None:
        """`stream`'s CUDA ring ran (`stats`: its `RingStats`): what read its chunks ("io_uring" or "threads",
        with why not io_uring or why its workers ran uncapped), what copied them ("driver" or "torch") and
        what its host buffers were ("registered", "torch-pinned" or "pageable", with why)."""
        r = self.report
        r.ring_reader, r.ring_reader_note, r.ring_copier = stats.reader, stats.reader_note, stats.copier
        r.ring_staging, r.ring_staging_note = stats.staging, stats.staging_note

    def dropped_page_cache(self) -> None:
        """The placement dropped every range it read from the page cache."""
        self.report.page_cache_dropped = True

    def placed(self, name: str, nbytes: int) -> None:
        r = self.report
        r.tensors_placed += 1
        r.bytes_placed += nbytes
        r.loaded.append(name)
        sample = self._take()
        if self._on_tensor is not None:
            self._on_tensor(TensorPlaced(r.tensors_placed, r.tensors_total, name, nbytes, r.bytes_placed, sample))

    def finish(self) -> None:
        """Call after the device is synchronised: stops the clock, takes a last sample, fills the ratios."""
        end = self._clock()
        self._take()
        r = self.report
        r.mem_free_after = mem_free()
        if self._start is not None:
            r.load_seconds = end - self._start
            r.throughput_gbps = r.bytes_read / r.load_seconds / 1e9 if r.load_seconds > 0 else 0.0
        base = self._base
        if r.bytes_placed and base is not None:
            r.footprint_ratio = self._max_footprint / r.bytes_placed
            r.host_peak_ratio = (self._max_rss - base.vm_rss) / r.bytes_placed
            r.memavailable_cost_ratio = (base.mem_available - self._min_available) / r.bytes_placed
        r.peak_device_allocated_bytes = self._max_device

    def _take(self) -> MemorySample:
        s = self._probe.sample()
        self.report.samples += 1
        base = self._base or s
        self._max_rss = max(self._max_rss, s.vm_rss)
        self._min_available = min(self._min_available, s.mem_available) if self._base else s.mem_available
        self._max_device = max(self._max_device, s.device_allocated)
        self._max_footprint = max(
            self._max_footprint, (s.vm_rss - base.vm_rss) + (s.device_allocated - base.device_allocated)
        )
        return s
