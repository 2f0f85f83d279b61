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

The ring's size is `ring_sizing`'s, the options are checked in `tuning`.
Each shard's file descriptor is closed once its last tensor is read. With
`drop_page_cache` (default on for unified-memory targets) every range read is
dropped from the page cache behind the reader, so a finished load leaves none
of the checkpoint there.
"""

from __future__ import annotations

from core.echo import NAME_LIMIT, echo, echo_name
import contextlib
import itertools
import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import torch

from ..metadata import TensorMeta
from machine.device import DeviceInfo, probe_device
from core.errors import PlacementError
from ..io.host_blocks import next_power_of_two
from ..io.reading import byte_view, read_into_fresh
from ..metadata import ComponentMeta
from .base import LoadPlan, Placement, PlacementContext, PlacementCost, PlannedTarget, register_placement
from .files import OpenFiles, mostly_uncached, sampled_residency
from .chunks import Piece
from .ranges import RangeRing, RingStats
from .ring_sizing import RING_CHUNK_BYTES, RING_READ_BYTES, RingGeometry, ring_geometry
from .staging import Staging
from .tuning import TUNING_OPTIONS, StreamTuning, flag_option, positive_option

_MiB = 1024 * 1024

DIRECT_WINDOW_PIECES = 8
"""CPU direct reads: how many `read_bytes` pieces of later tensors may be queued before the oldest
tensor is placed (a window that keeps every reader busy across tensor boundaries)."""
STAGING_BYTES = 32 * _MiB
"""Converting staging: the bytes of each of its buffers."""
DIRECT_READ_BYTES = 16 * _MiB
"""CPU targets: the positioned read size straight into the destination."""


def drop_by_default(info: DeviceInfo | None) -> bool:
    """`drop_page_cache`'s default: on for a unified-memory CUDA target (its free memory follows MemFree,
    so a cached checkpoint looks like memory in use), off elsewhere (`info` None: a CPU target)."""
    return info is not None and info.kind == "cuda" and info.unified_memory


@register_placement("stream")
class StreamPlacement(Placement):
    """Positioned reads into the destination; a ring of pinned buffers to CUDA; bounded staging to convert."""

    options = ("threads", "direct_io", "drop_page_cache", "reserve") + TUNING_OPTIONS
    """The product's options, then `StreamTuning`'s, which are also taken as keywords (benchmark case strings,
    the sharded placement)."""
    summary = "reads tensor by tensor straight into place, never builds a dict"
    typical_footprint = 1.0
    glyph = "┈"
    dash = (4, 3)
    forecast_reads_memory = True

    def __init__(self, *, tuning: StreamTuning | None = None, **options):
        super().__init__(**options)
        self.threads = positive_option(options, "threads", None)
        """Readers of a load (see `reader_threads`); None for the default."""
        self.direct_io = flag_option(options, "direct_io", None)
        """O_DIRECT for the CUDA ring: None (default) for files mostly not in the page cache, True always, False never."""
        self.drop_page_cache = flag_option(options, "drop_page_cache", None)
        """None (default): on for unified-memory CUDA targets, off elsewhere."""
        self.reserve = flag_option(options, "reserve", True)
        """Reserve the ring's CUDA destinations in one allocator block before allocating them (False: one by one,
        for a DiT quantized as it loads, whose block would stay half free for the rest of the run)."""
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
        info = (ctx.device_info or probe_device(str(ctx.device))) if cuda else None  # probed once per job
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

    def forecast_cost(self, component: ComponentMeta, targets: list[tuple[TensorMeta, torch.dtype]],
                      device: DeviceInfo) -> PlacementCost:
        """The buffers, as `place` sizes them. CPU target: tensors in their stored dtype are read into the
        parameters; converted ones pass through `staging_buffers` (default 4) host buffers of min(staging
        bytes, largest staged source). CUDA: same-dtype tensors go through the ring of pinned buffers
        `ring_geometry` sizes (deeper when the files are not in the page cache); converted ones through the
        staging buffers, pinned (the caching host allocator rounds pinned sizes up to a power of two), plus one
        device-side buffer for the conversion. Other devices stage everything, unpinned."""
        cuda = device.kind == "cuda"

        def path(meta: TensorMeta, dtype: torch.dtype) -> str:
            same = dtype == meta.torch_dtype
            if same and device.kind == "cpu":
                return "direct"
            return "ring" if same and cuda and self.tuning.ranges else "staged"

        kinds = [(meta, dtype, path(meta, dtype)) for meta, dtype in targets]
        pinned = cuda and self.tuning.pin
        total = 0
        staged = [(m, d) for m, d, k in kinds if k == "staged"]
        if staged:
            size = min(self.converting_bytes, max(m.nbytes for m, _ in staged))
            count = self.tuning.staging_buffers or 4
            total += count * (next_power_of_two(size) if pinned else size)
            if cuda and any(d != m.torch_dtype for m, d in staged):
                total += size
        ring_bytes = sum(m.nbytes for m, _, k in kinds if k == "ring")
        if ring_bytes:
            geometry = ring_geometry(
                ring_bytes, device, threads=self.reader_threads(cuda=True), chunk_bytes=self.ring_chunk_bytes,
                buffers=self.tuning.staging_buffers, available=_mem_available(),
                read_bytes=self.ring_read_bytes,
                disk=self.ring_reads_disk({m.file for m, _, k in kinds if k == "ring"}),
            )
            chunk = next_power_of_two(geometry.chunk_bytes) if pinned else geometry.chunk_bytes
            total += geometry.buffers * chunk
        return PlacementCost(staging=total)

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
        elif self.reserve:
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
        if not (first and self.reserve):
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
            fd, name = files.fd(meta), f"{echo_name(meta.file.name)}: tensor {echo(meta.name, NAME_LIMIT)}"
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
    from machine.memory import sample_memory

    return sample_memory().mem_available
