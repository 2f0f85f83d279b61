"""`stream` (the default): no dict, no mmap; positioned reads straight into the destination.

Three paths, chosen per tensor, in plan order:

- CPU target, checkpoint dtype: the bytes are read directly into the freshly
  allocated parameter, each piece's pages faulted in with one call before its
  read, split over a few threads so the reads overlap.
- CUDA target, checkpoint dtype: each shard's planned bytes are read as whole
  contiguous ranges into a ring of pinned buffers sized by the readers and
  the model (and, on unified memory, by the pool), many reads in flight on
  io_uring's kernel workers (reader threads where io_uring is refused), each
  filled buffer copied to its destination slices on a side stream through
  the CUDA driver (`ranges.RangeRing`); files the page cache does not hold
  are read with O_DIRECT, through a deeper ring.
- A dtype change (any device): per-tensor staging through a few small
  buffers, converted on the way (`staging.Staging`), with POSIX_FADV_WILLNEED
  just ahead of the reads so a cold disk never waits between buffers.

Each shard's file descriptor is closed once its last tensor is read. With
`drop_page_cache` (default on for unified-memory targets) every range read is
dropped from the page cache behind the reader, so a finished load leaves none
of the checkpoint there.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from functools import partial

import torch

from ..metadata import TensorMeta
from ..device import DeviceInfo, probe_device
from ..errors import PlacementError
from ..reading import byte_view, read_into_fresh
from .base import LoadPlan, Placement, PlacementContext, PlannedTarget, register_placement
from .files import OpenFiles, mostly_uncached, sampled_residency
from .ranges import ALIGN, Piece, RangeRing, RingStats
from .staging import Staging

_MiB = 1024 * 1024

DIRECT_WINDOW_PIECES = 8
"""CPU direct reads: how many `read_bytes` pieces of later tensors may be queued before the oldest
tensor is placed (a window that keeps every reader busy across tensor boundaries)."""
STAGING_SHARE = 64
"""The ring's buffers together hold at most 1/STAGING_SHARE of the bytes they carry (footprint <= 1.016)."""
STAGING_MAX = 1024 * _MiB
"""...and never more than this."""
UNIFIED_POOL_SHARE = 256
"""On unified memory the pinned ring also stays under 1/UNIFIED_POOL_SHARE of the pool's available bytes:
it comes out of the memory the model itself is loaded into."""
MIN_BUFFERS = 3
"""Fewest ring buffers: two reading while one is copied out."""
SPARE_BUFFERS = 4
"""Ring buffers beyond those whose reads keep every reader busy: copies queued on the device while the
next reads run. More staging made the copies slower (see RING_CHUNK_BYTES and docs/benchmarks.md, Ring
settings on one H200)."""
RING_READ_BYTES = 4 * _MiB
"""The ring's positioned read size: small reads read the page cache faster than large ones; see
docs/benchmarks.md, Ring settings on one H200."""
RING_CHUNK_BYTES = 16 * _MiB
"""The ring's buffer size: the host-to-device copies ran faster the less staging the ring cycled
through; see docs/benchmarks.md, Ring settings on one H200."""
STAGING_BYTES = 32 * _MiB
"""Converting staging: the bytes of each of its buffers."""
DIRECT_READ_BYTES = 16 * _MiB
"""CPU targets: the positioned read size straight into the destination."""


@dataclass(frozen=True)
class RingGeometry:
    """How many ring buffers of what size a load gets, and why."""

    buffers: int
    """Buffer count."""
    chunk_bytes: int
    """Bytes per buffer (a multiple of the O_DIRECT alignment)."""
    read_bytes: int
    """Bytes per positioned read: a buffer is filled by chunk_bytes / read_bytes reads in parallel."""
    budget: int
    """The staging budget the geometry was fitted into."""
    unified: bool
    """Whether the pool was shared with the host (the budget then also follows the pool)."""
    disk: bool = False
    """Whether the ring reads from the disk (O_DIRECT), and so holds every buffer the budget allows."""


def ring_geometry(
    total_bytes: int,
    info: DeviceInfo,
    *,
    threads: int,
    chunk_bytes: int,
    buffers: int | None,
    available: int,
    read_bytes: int = RING_READ_BYTES,
    disk: bool = False,
) -> RingGeometry:
    """The ring for `total_bytes` of same-dtype tensors on device `info`; `disk` when its reads go to
    the disk rather than the page cache.

    Budget: 1/STAGING_SHARE of the bytes, at most STAGING_MAX, and on unified
    memory at most 1/UNIFIED_POOL_SHARE of the pool (the smaller of the
    device's memory and the host's MemAvailable). `buffers` (the
    staging_buffers option) fixes the count; otherwise enough buffers being
    read to give every reader thread a `read_bytes` read, plus SPARE_BUFFERS,
    as many as the budget holds, at least MIN_BUFFERS (pinning costs time,
    so no more are allocated than the readers can fill). Reading from the
    disk, the count is as many as the budget holds: the disk's rate grows with
    the bytes in flight, and beside a read of several seconds per GiB,
    pinning 600 MiB on the helper costs nothing (see docs/benchmarks.md,
    Ring settings on one H200). Buffers shrink (down to 4 MiB) before the
    count goes under MIN_BUFFERS, and never exceed what the model needs.
    """
    budget = min(total_bytes // STAGING_SHARE, STAGING_MAX)
    pools = [x for x in (info.total_memory, available) if x]
    if info.unified_memory and pools:
        budget = min(budget, min(pools) // UNIFIED_POOL_SHARE)
    chunk = max(ALIGN, chunk_bytes - chunk_bytes % ALIGN)
    read = max(ALIGN, min(read_bytes - read_bytes % ALIGN, chunk))
    if buffers is None:
        reading = -(-threads * read // chunk)
        count = max(MIN_BUFFERS, budget // chunk if disk else min(reading + SPARE_BUFFERS, budget // chunk))
        if count * chunk > budget:  # a power of two: what the pinned allocator hands out anyway
            chunk = max(4 * _MiB, 1 << max(12, (budget // count).bit_length() - 1))
    else:
        count = max(2, buffers)
    chunk = min(chunk, -(-max(total_bytes, 1) // ALIGN) * ALIGN)
    return RingGeometry(count, chunk, min(read, chunk), budget, info.unified_memory, disk)


@dataclass(frozen=True)
class StreamTuning:
    """`stream`'s options that exist to compare its parts on a benchmark, kept out of the product's own
    (as vLLM keeps a load's options in one LoadConfig): every default is what the product runs."""

    read_bytes: int | None = None
    """Bytes per positioned read: None for DIRECT_READ_BYTES on CPU targets, RING_READ_BYTES in the CUDA ring."""
    staging_bytes: int | None = None
    """Bytes per staging buffer: None for RING_CHUNK_BYTES in the CUDA ring, STAGING_BYTES to convert."""
    staging_buffers: int | None = None
    """Ring buffer count (None: sized by `ring_geometry`); converting staging buffers (None: 4)."""
    readahead_bytes: int = 64 * _MiB
    """POSIX_FADV_WILLNEED window ahead of the converting staging's reads."""
    copy_streams: int = 1
    """Streams the ring's copies are spread over."""
    pin: bool = True
    """Page-locked staging (False: pageable buffers)."""
    ranges: bool = True
    """False sends CUDA same-dtype tensors through per-tensor staging instead of the ring."""
    io_uring: bool | None = None
    """The CUDA ring's reader: None io_uring where the kernel allows it (and on x86), else threads;
    True io_uring or an error; False threads."""
    driver_copies: bool = True
    """The CUDA ring queues its copies through the CUDA driver where it can (False: through torch)."""
    reserve: bool = True
    """Reserve the ring's CUDA destinations in one allocator block before allocating them (False: one by one)."""

    @classmethod
    def from_options(cls, options: dict) -> "StreamTuning":
        """From keyword options, each checked (a bad one is a PlacementError naming it); missing ones default."""
        values = {}
        for f in fields(cls):
            if f.name not in options:
                continue
            if f.type.startswith("bool"):
                values[f.name] = _flag(options, f.name, f.default)
            else:
                values[f.name] = _positive(options, f.name, f.default, minimum=0 if f.name == "readahead_bytes" else 1)
        return cls(**values)


TUNING_OPTIONS = tuple(f.name for f in fields(StreamTuning))


def drop_by_default(info: DeviceInfo | None) -> bool:
    """`drop_page_cache`'s default: on for a unified-memory CUDA target (its free memory follows MemFree,
    so a cached checkpoint looks like memory in use), off elsewhere (`info` None: a CPU target)."""
    return info is not None and info.kind == "cuda" and info.unified_memory


@register_placement("stream")
class StreamPlacement(Placement):
    """Positioned reads into the destination; a ring of pinned buffers to CUDA; bounded staging to convert."""

    options = ("threads", "direct_io", "drop_page_cache") + TUNING_OPTIONS
    """The product's options, then `StreamTuning`'s, which are also taken as keywords (benchmark case strings,
    the sharded placement)."""

    def __init__(self, *, tuning: StreamTuning | None = None, **options):
        super().__init__(**options)
        self.threads = _positive(options, "threads", None)
        """Readers of a load (see `reader_threads`); None for the default."""
        self.direct_io = _flag(options, "direct_io", None)
        """O_DIRECT for the CUDA ring: None (default) for files mostly not in the page cache, True always, False never."""
        self.drop_page_cache = _flag(options, "drop_page_cache", None)
        """None (default): on for unified-memory CUDA targets, off elsewhere."""
        given = {k: options[k] for k in TUNING_OPTIONS if k in options}
        if tuning is not None and given:
            raise PlacementError(f"placement mode 'stream': give {', '.join(given)} in tuning=StreamTuning(...), not beside it")
        self.tuning = tuning if tuning is not None else StreamTuning.from_options(given)
        """The options that exist to compare the loader's parts (defaults: what the product runs)."""
        self.last_ring: RingStats | None = None
        """Where the ring's time went in the last load (None when no tensor went through it)."""
        self.last_geometry: RingGeometry | None = None
        """The ring of the last load."""
        self.dropped_page_cache = False
        """Whether the last load dropped what it read from the page cache."""

    def place(self, plan: LoadPlan, ctx: PlacementContext) -> None:
        cuda = ctx.device.type == "cuda"
        kinds = {p.name: self._path(p, ctx.device) for p in plan.targets}
        info = probe_device(str(ctx.device)) if cuda else None
        drop = self.drop_page_cache if self.drop_page_cache is not None else drop_by_default(info)
        self.dropped_page_cache = drop
        self.last_ring = self.last_geometry = None
        threads = self.reader_threads(cuda)
        # Threads start on the first task, so nothing runs before its shutdown is on the stack below.
        pool = ThreadPoolExecutor(threads, thread_name_prefix="drainboard-read") if threads > 1 else None
        ring_files = {m.file: m.checked for p in plan.targets if kinds[p.name] == "ring" for m in p.sources}
        residency = sampled_residency(ring_files) if self.direct_io is None else {}
        pending: deque[tuple[PlannedTarget, torch.Tensor, list[Future]]] = deque()
        with contextlib.ExitStack() as cleanup:
            # Run last to first: cancel what is queued, stop the readers, free the buffers, close the files,
            # and wait for the reserve helper (no allocation of this load may outlive it). One that raises
            # does not skip the others.
            reservation = self._reserve_ahead(plan, kinds, ctx)
            if reservation is not None:
                cleanup.callback(reservation.exception)
            files = OpenFiles(plan, self.tuning.readahead_bytes, direct_io=self.direct_io, drop_page_cache=drop,
                              residency=residency)
            cleanup.callback(files.close_all)
            staging = self._staging(plan, kinds, ctx, files, pool, threads)
            ring = self._ring(plan, kinds, ctx, files, pool, threads, info, residency)
            if ring is not None:
                cleanup.callback(ring.release)
            cleanup.callback(staging.release)
            if pool is not None:
                cleanup.callback(pool.shutdown, wait=True)
            if ring is not None:
                cleanup.callback(ring.cancel)
            cleanup.callback(staging.cancel)
            cleanup.callback(_cancel_pending, pending)
            if ring is not None:
                ring.open()  # beside the destination reserve
            for kind, group in itertools.groupby(plan.targets, key=lambda p: kinds[p.name]):
                if kind == "ring":
                    self._place_ring(list(group), ring, reservation, files, ctx)
                    reservation = None
                elif kind == "direct":
                    self._place_direct(group, files, pool, ctx, pending)
                else:
                    self._place_staged(group, staging, files, ctx)
            if ring is not None:
                ring.finish()
                self.last_ring = ring.stats
                ctx.meter.ring_ran(ring.stats)
        if drop:
            ctx.meter.dropped_page_cache()

    def _path(self, planned: PlannedTarget, device: torch.device) -> str:
        """How a target is read: "direct" (CPU, its dtype), "ring" (CUDA, its dtype) or "staged" (converted)."""
        same = all(m.torch_dtype == planned.dtype for m in planned.sources)
        if same and device.type == "cpu":
            return "direct"
        return "ring" if same and device.type == "cuda" and self.tuning.ranges else "staged"

    def _staging(self, plan, kinds, ctx, files, pool, threads) -> Staging:
        """The converting staging, sized by the largest source it will convert."""
        largest = max((m.nbytes for p in plan.targets if kinds[p.name] == "staged" for m in p.sources), default=0)
        return Staging(ctx.device, pool, files, min(self.converting_bytes, largest),
                       buffers=self.tuning.staging_buffers or 4, threads=threads, pin=self.tuning.pin)

    def _ring(self, plan, kinds, ctx, files, pool, threads, info, residency) -> RangeRing | None:
        """The CUDA ring for the ring targets (None without any), its geometry kept in `last_geometry`."""
        ring_bytes = sum(m.nbytes for p in plan.targets if kinds[p.name] == "ring" for m in p.sources)
        if not ring_bytes:
            return None
        g = self.last_geometry = ring_geometry(
            ring_bytes, info, threads=threads, chunk_bytes=self.ring_chunk_bytes, buffers=self.tuning.staging_buffers,
            available=_mem_available(), read_bytes=self.ring_read_bytes, disk=self._reads_disk(residency),
        )
        return RangeRing(
            ctx.device, pool, files, buffers=g.buffers, chunk_bytes=g.chunk_bytes, read_bytes=g.read_bytes,
            pin=self.tuning.pin, copy_streams=self.tuning.copy_streams,
            reader={None: "auto", True: "io_uring", False: "threads"}[self.tuning.io_uring], readers=threads,
            driver_copies=self.tuning.driver_copies,
        )

    def _place_ring(self, group: list[PlannedTarget], ring: RangeRing, reservation: Future | None, files: OpenFiles,
                    ctx: PlacementContext) -> None:
        """Same-dtype CUDA targets through the ring, their destinations reserved in one block first (by the
        helper started at the load's start, for the first group)."""
        t = time.perf_counter()
        if reservation is not None:
            reservation.result()
        elif self.tuning.reserve:
            ctx.reserve(group)
        ring.stats.reserve += time.perf_counter() - t
        ring.run(self._pieces(group, files, ctx))

    def _place_direct(self, group, files: OpenFiles, pool: ThreadPoolExecutor | None, ctx: PlacementContext,
                      pending: deque) -> None:
        """Same-dtype CPU targets read straight into their destinations, a window of reads in flight."""
        window, queued = DIRECT_WINDOW_PIECES * self._direct_read_bytes, 0
        for planned in group:
            dest = ctx.allocate(planned)
            pending.append((planned, dest, self._submit_direct(planned, dest, files, pool)))
            queued += planned.nbytes  # a running total: summing the window per tensor was quadratic
            while len(pending) > 1 and queued > window:
                queued -= pending[0][0].nbytes
                self._finish(pending.popleft(), files, ctx)
        while pending:
            self._finish(pending.popleft(), files, ctx)

    def _place_staged(self, group, staging: Staging, files: OpenFiles, ctx: PlacementContext) -> None:
        """Targets whose dtype changes, converted through the staging buffers."""
        for planned in group:
            dest = ctx.allocate(planned)
            flat = dest.view(-1)
            start = 0
            for i, meta in enumerate(planned.sources):
                last = i == len(planned.sources) - 1
                done = partial(self._source_read, meta, files, ctx, (planned, dest) if last else None)
                staging.copy(meta, flat[start : start + meta.numel], done)
                start += meta.numel
        staging.finish()

    def _reserve_ahead(self, plan: LoadPlan, kinds: dict[str, str], ctx: PlacementContext) -> Future | None:
        """Reserve the first ring group's destinations on a helper thread, when the plan starts with one.

        Reserving takes about as long as the rest of the set-up before the
        first read (the driver maps the block; sampling the page cache,
        building the ring, opening io_uring): run side by side, the first copy
        starts that much sooner. Later groups,
        after staged tensors, reserve in line (the staged ones must not carve
        the block).
        """
        first = list(itertools.takewhile(lambda p: kinds[p.name] == "ring", plan.targets))
        if not (first and self.tuning.reserve):
            return None
        index = ctx.device.index if ctx.device.index is not None else torch.cuda.current_device()

        def reserve() -> int:
            with torch.cuda.device(index):  # the helper's current device is not the caller's
                return ctx.reserve(first)

        helper = ThreadPoolExecutor(1, thread_name_prefix="drainboard-reserve")
        future = helper.submit(reserve)
        helper.shutdown(wait=False)
        return future

    @property
    def _direct_read_bytes(self) -> int:
        return self.tuning.read_bytes or DIRECT_READ_BYTES

    @property
    def ring_chunk_bytes(self) -> int:
        """The CUDA ring's buffer size asked for (ring_geometry may shrink it)."""
        return self.tuning.staging_bytes or RING_CHUNK_BYTES

    def reader_threads(self, cuda: bool) -> int:
        """Readers of a load (the pool's threads, or the cap on io_uring's kernel workers): the threads
        option, else one per core up to 8 on CPU targets (two saturate a 2-core box), and on CUDA up
        to 16 (what a 16-core host needs to read the page cache as fast as the copies run) less two
        cores for the loader's thread and the driver's, which uncapped io_uring workers crowd out; see
        docs/benchmarks.md, Ring settings on one H200."""
        cpus = os.cpu_count() or 2
        return self.threads or (max(2, min(16, cpus - 2)) if cuda else max(2, min(8, cpus)))

    def ring_reads_disk(self, files) -> bool:
        """Whether the CUDA ring will read `files` from the disk: O_DIRECT forced, or left to the cache
        state (the default) and most of their bytes out of the page cache."""
        return self._reads_disk(sampled_residency(files) if self.direct_io is None else {})

    def _reads_disk(self, residency) -> bool:
        return self.direct_io is True or (self.direct_io is None and mostly_uncached(residency))

    @property
    def ring_read_bytes(self) -> int:
        """The CUDA ring's positioned read size."""
        return self.tuning.read_bytes or RING_READ_BYTES

    @property
    def converting_bytes(self) -> int:
        """Each converting staging buffer's size at most."""
        return self.tuning.staging_bytes or STAGING_BYTES

    def _pieces(self, group, files: OpenFiles, ctx: PlacementContext):
        """Each source of the group's targets with the destination bytes it fills, allocating as it goes."""
        for planned in group:
            dest = ctx.allocate(planned)
            flat = dest.view(-1).view(torch.uint8)
            start = 0
            for i, meta in enumerate(planned.sources):
                last = i == len(planned.sources) - 1
                done = partial(self._source_read, meta, files, ctx, (planned, dest) if last else None)
                yield Piece(meta, flat[start : start + meta.nbytes], done)
                start += meta.nbytes

    def _submit_direct(
        self, planned: PlannedTarget, dest: torch.Tensor, files: OpenFiles, pool: ThreadPoolExecutor | None
    ) -> list[Future]:
        """Queue reads of every source into its slice of `dest`, in `read_bytes` pieces."""
        futures: list[Future] = []
        flat = dest.view(-1)
        start = 0
        for meta in planned.sources:
            view = byte_view(flat[start : start + meta.numel])
            start += meta.numel
            fd, name = files.fd(meta), f"{meta.file.name}: tensor {meta.name!r}"
            step = self._direct_read_bytes
            for lo in range(0, len(view), step):
                piece = view[lo : lo + step]
                if pool is None:
                    read_into_fresh(fd, meta.offset + lo, piece, name=name)
                else:
                    futures.append(pool.submit(read_into_fresh, fd, meta.offset + lo, piece, name=name))
        return futures

    def _finish(self, item: tuple[PlannedTarget, torch.Tensor, list[Future]], files: OpenFiles, ctx: PlacementContext) -> None:
        planned, dest, futures = item
        for f in futures:
            f.result()
        for meta in planned.sources:
            ctx.meter.read(meta.nbytes)
            files.done(meta)
        ctx.place(planned, dest)

    @staticmethod
    def _source_read(
        meta: TensorMeta, files: OpenFiles, ctx: PlacementContext, placed: tuple[PlannedTarget, torch.Tensor] | None
    ) -> None:
        """All of `meta`'s bytes have left its file: count them, maybe close it, place the target after its last source."""
        ctx.meter.read(meta.nbytes)
        files.done(meta)
        if placed is not None:
            ctx.place(*placed)


def _cancel_pending(pending: deque) -> None:
    """Cancel the direct reads not yet started (after a failure; empty after a load that finished)."""
    for _, _, futures in pending:
        for f in futures:
            f.cancel()


def _mem_available() -> int:
    from ..memory import sample_memory

    return sample_memory().mem_available


def _positive(options: dict, key: str, default: int | None, *, minimum: int = 1) -> int | None:
    value = options.get(key, default)
    if value is None and default is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise PlacementError(f"placement mode 'stream' option {key} must be {kind}, got {value!r}")
    return value


def _flag(options: dict, key: str, default: bool | None) -> bool | None:
    value = options.get(key, default)
    if value is not None and not isinstance(value, bool):
        raise PlacementError(f"placement mode 'stream' option {key} must be true or false, got {value!r}")
    return value
