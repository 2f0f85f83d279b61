"""Whole contiguous file ranges to a CUDA device through a ring of pinned buffers.

Tensors that keep their dtype need no per-tensor staging: their bytes lie
back to back in each shard, so `stream` reads each shard's planned range in
buffer-sized chunks, each filled by several positioned reads in flight at
once, and copies every piece of a filled buffer to its destination slice on
a side stream (through the CUDA driver, `loader.io.cuda_copy`, where it can).

The reads go through io_uring (`loader.io.uring`: the kernel's workers, capped
at the reader count, copy from the page cache, so no Python thread competes
with the one queueing the copies) or, where io_uring is refused, a pool of
reader threads. A buffer is refilled once the device event of its last copy
has passed; the ring keeps copies queued while it waits for reads. Files the
page cache does not hold are read with O_DIRECT (the chunks are aligned for
it), so a cold load streams from the disk at its queue depth and leaves no
pages behind.

What a chunk is and how one is read live beside it (`chunks`, `chunk_reads`).

The pipeline is device-agnostic for the copy step: on a CPU destination the
copy is a plain memcpy, which is how the tests check its chunking, alignment
and O_DIRECT handling without a GPU.
"""

from __future__ import annotations

from core.echo import NAME_LIMIT, echo, echo_name
import contextlib
import errno
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ..io.cuda_copy import DriverCopier, copy_streams_for
from core.errors import PlacementError
from ..io.pinned import POOL, HostStaging, current_context
from ..io.uring import ReadQueue, UringUnavailable, auto_refusal
from .chunk_reads import FileHandles, QueuedRead, read_chunk
from .chunks import ALIGN, Chunk, Piece, chunk_name, plan_chunks


COPY_QUEUE = 2
"""Buffers whose copies the ring keeps queued on the device before it waits for a copy to free one.
Waiting while only one was queued (the copy just issued) left the copy engine idle for the loader's
bookkeeping between any two chunks; waiting for reads while copies are queued leaves it busy."""


@dataclass
class RingStats:
    """Seconds the main thread spent per activity, and what went through the ring.

    `read_wait` large means the readers (disk or page cache) are the limit;
    `copy_wait` large means the host-to-device copies are.
    """

    chunks: int = 0
    """Chunks read."""
    direct_chunks: int = 0
    """Of them, read with O_DIRECT."""
    bytes: int = 0
    """Planned bytes that went through the buffers."""
    read_wait: float = 0.0
    """Waiting for the oldest chunk's reads."""
    copy_issue: float = 0.0
    """Queueing copies (and dropping read ranges from the page cache)."""
    copy_wait: float = 0.0
    """Waiting for a buffer's last copy before refilling it."""
    allocate: float = 0.0
    """Allocating (and pinning) buffers."""
    setup: float = 0.0
    """Before the first chunk: opening the reader and the copiers, starting the pinning helper (`open`)."""
    reserve: float = 0.0
    """Waiting for the destinations' device memory to be reserved in one block (`PlacementContext.reserve`,
    timed by the placement; for a plan that starts with ring tensors, run on a helper from the load's start)."""
    plan: float = 0.0
    """Planning chunks, which allocates each tensor's destination as its first chunk is planned."""
    submit: float = 0.0
    """Queueing each chunk's reads (io_uring entries and the syscall handing them over, or pool tasks)."""
    final_sync: float = 0.0
    """Waiting for the last copies at the end."""
    place: float = 0.0
    """Handing finished sources back: installing each tensor into the module and sampling memory."""
    reader: str = ""
    """What read the chunks: "io_uring" (the kernel's workers) or "threads" (the reader pool)."""
    reader_note: str = ""
    """Why io_uring was not used, where it was not, or why its kernel workers ran uncapped."""
    copier: str = ""
    """What queued the host-to-device copies: "driver" (cuMemcpyHtoDAsync) or "torch" (Tensor.copy_);
    empty on a CPU destination."""
    staging: str = ""
    """What the host buffers are: "registered" (`loader.io.pinned`, cuMemHostRegister), "torch-pinned"
    (torch's pinned allocator, cudaHostAlloc) or "pageable"; empty on a CPU destination."""
    staging_note: str = ""
    """Why the buffers are not registered, where they are not (the refusals, in order)."""


def _starts(lo: int, hi: int, step: int) -> list[int]:
    """Where the parts of [lo, hi) begin: lo, then every multiple of `step` above it (none when empty)."""
    return [lo, *range(lo - lo % step + step, hi, step)] if hi > lo else []


_UNSETTLED: list[torch.Tensor] = []
"""Buffers of rings whose io_uring reads could not be settled (cancelled and waited for): held for the
life of the process, since the kernel may still write into them."""


class RangeRing:
    """The ring: `buffers` host buffers of `chunk_bytes`, read by io_uring (or on `pool`), copied out in order.

    `reader` is "auto" (io_uring where the kernel allows it, else the pool),
    "io_uring" (an error where it is refused) or "threads". `readers` caps the
    kernel threads io_uring reads on (0: the kernel's default, up to one per
    queue entry: 40 for the default ring, which on 16 cores starved the thread
    that queues the copies; see docs/benchmarks.md, Ring settings on one H200).
    `driver_copies` queues the copies through the CUDA driver
    (`loader.io.cuda_copy`) where it can, else through torch.
    """

    def __init__(
        self,
        device: torch.device,
        pool: ThreadPoolExecutor | None,
        files: FileHandles,
        *,
        buffers: int,
        chunk_bytes: int,
        read_bytes: int,
        pin: bool,
        copy_streams: int = 1,
        reader: str = "threads",
        readers: int = 0,
        driver_copies: bool = True,
    ):
        if reader not in ("auto", "io_uring", "threads"):
            raise ValueError(f"reader must be auto, io_uring or threads, got {reader!r}")
        if chunk_bytes % ALIGN or read_bytes % ALIGN:
            raise ValueError(f"chunk_bytes and read_bytes must be multiples of {ALIGN}, got {chunk_bytes}, {read_bytes}")
        self._device = device
        self._pool = pool
        self._files = files
        self._count = max(buffers, 2)
        self._chunk = chunk_bytes
        self._cuda = device.type == "cuda"
        self._pin = pin and self._cuda
        self._read_bytes = read_bytes
        """Bytes per positioned read: each chunk is read in parts this large, in parallel."""
        self._buffers: list[torch.Tensor | None] = [None] * self._count
        self._events = [torch.cuda.Event() for _ in range(self._count)] if self._cuda else []
        self._free: deque[int] = deque(range(self._count))
        """Buffers neither being read nor holding queued copies."""
        self._copying: deque[int] = deque()
        """Buffers whose copies are queued on the device, oldest first (each waits on its event)."""
        self._driver_copies = driver_copies and self._cuda
        self._copiers: list[DriverCopier | None] = []
        self._streams = copy_streams_for(device, max(copy_streams, 1)) if self._cuda else []
        self._flight: deque[tuple[Chunk, int, list]] = deque()
        self._reader = reader
        self._readers = readers
        self._queue: ReadQueue | None = None
        self._pinning: list[Future] = []
        """The helper's allocations, one per buffer, while pinning runs in the background."""
        self.staging = HostStaging(POOL)
        """Where the host buffers come from, and what was refused (see `loader.io.pinned.HostStaging`)."""
        self.allocated_bytes = 0
        """Host bytes held by the buffers allocated so far."""
        self.stats = RingStats()
        """Where the main thread's time went in the last `run`."""

    def open(self) -> None:
        """Open the reader and the copiers and start pinning: the set-up before the first read, which
        `run` does itself if no one has (the placement calls it early, beside the destination reserve)."""
        t = time.perf_counter()
        self._open_reader()
        if self._cuda:
            with torch.cuda.device(self._device):
                self.start_pinning()
                self._open_copiers()
        self.stats.setup += time.perf_counter() - t

    def run(self, pieces: Iterable[Piece]) -> None:
        """Read and copy out every piece; returns once every copy is queued (see `finish`)."""
        stats, clock = self.stats, time.perf_counter
        self.open()
        with torch.cuda.device(self._device) if self._cuda else contextlib.nullcontext():
            chunks = plan_chunks(pieces, self._chunk)
            t2 = clock()
            for chunk in chunks:
                t = clock()
                stats.plan += t - t2
                k = self._take_free()
                buf = self._buffer(k)
                t = clock()
                self._flight.append((chunk, k, self._submit(chunk, buf)))
                t2 = clock()
                stats.submit += t2 - t
                stats.chunks += 1
            stats.plan += clock() - t2
            while self._flight:
                self._retire()

    def finish(self) -> None:
        """Wait for every queued copy."""
        t = time.perf_counter()
        for s in self._streams:
            s.synchronize()
        self.stats.final_sync += time.perf_counter() - t

    def cancel(self) -> None:
        """Drop queued reads after a failure: pool tasks not yet started are cancelled, and the io_uring
        queue is closed, which cancels its reads and waits for them (`release` keeps the buffers if it
        cannot)."""
        while self._flight:
            for f in self._flight.popleft()[2]:
                f.cancel()
        self._close_queue()

    def release(self) -> None:
        """Wait for the copies and for every read in flight, then free the buffers and the queue."""
        self.finish()
        pinned = [f.result() for f in self._pinning if not f.cancel() and f.exception() is None]
        self._pinning = []
        buffers = pinned + [b for b in self._buffers if b is not None]
        self._buffers = [None] * self._count
        self._free, self._copying = deque(range(self._count)), deque()
        try:
            self._close_queue()
        except BaseException:
            if self._queue is not None:  # reads may still land in them: never free or reuse these
                _UNSETTLED.extend(buffers)
            raise
        POOL.give_back(buffers)  # no read or copy uses them now

    def _close_queue(self) -> None:
        if self._queue is not None:
            self._queue.close()
            self._queue = None

    def _open_reader(self) -> None:
        """io_uring for this run where asked and allowed, else the pool; the choice goes in the stats."""
        refusal = auto_refusal() if self._reader == "auto" else None
        if refusal:
            self.stats.reader_note = refusal
        elif self._queue is None and self._reader != "threads":
            parts = self._count * (self._chunk // self._read_bytes + 1)
            try:
                self._queue = ReadQueue.open(parts)
                if self._readers and not self._queue.limit_workers(self._readers):
                    self.stats.reader_note = (
                        f"io_uring's kernel workers could not be capped at {self._readers} (kernel before 5.15?)"
                    )
            except UringUnavailable as exc:
                if self._reader == "io_uring":
                    raise
                self.stats.reader_note = str(exc)
        self.stats.reader = "io_uring" if self._queue is not None else "threads"

    def _open_copiers(self) -> None:
        """One driver copier per stream where asked and possible (inside the device's context), else none."""
        if not self._cuda:
            return
        if not self._copiers:
            copiers = [DriverCopier.for_device(self._device, s) for s in self._streams] if self._driver_copies else []
            self._copiers = copiers if copiers and all(copiers) else [None] * len(self._streams)
        self.stats.copier = "driver" if self._copiers[0] is not None else "torch"

    def _take_free(self) -> int:
        """A free buffer to fill next, preferring one that is already allocated or pinned.

        While the helper is still pinning, the ring cycles the buffers it has
        rather than wait for the next one: pinning a buffer takes several times
        longer than reading and copying it out.
        Only with nothing read or copying does it wait for the pinning.
        """
        while True:
            for i, k in enumerate(self._free):
                if self._buffers[k] is not None or k >= len(self._pinning) or self._pinning[k].done():
                    del self._free[i]
                    return k
            if self._free and not self._flight and not self._copying:
                return self._free.popleft()
            self._make_room()

    def _buffer(self, k: int) -> torch.Tensor:
        """Buffer k, ALIGN-aligned: from the background pinning (see `start_pinning`), else allocated here."""
        buf = self._buffers[k]
        if buf is None:
            t = time.perf_counter()
            raw = self._pinning[k].result() if k < len(self._pinning) else self._allocate()
            skip = -raw.data_ptr() % ALIGN
            buf = self._buffers[k] = raw[skip : skip + self._chunk]
            self.allocated_bytes += raw.numel()
            self.stats.allocate += time.perf_counter() - t
        return buf

    def start_pinning(self) -> None:
        """Pin every buffer on a helper thread, in ring order, while the loader does other set-up and the
        first reads run (`open` starts it inside the device's context; starting it again does nothing).

        The helper registers memory with the driver (`loader.io.pinned`), which
        lets the loader's copies run beside it: torch's pinned allocator, which
        it uses where the driver library is not at hand, stalled them while it
        pinned (see docs/benchmarks.md, Ring settings on one H200).
        """
        if self._pin and not self._pinning and self._buffers[0] is None:
            context = current_context() if POOL.available() else None
            helper = ThreadPoolExecutor(1, thread_name_prefix="drainboard-pin")
            self._pinning = [helper.submit(self._allocate, context) for _ in range(self._count)]
            helper.shutdown(wait=False)

    def _allocate(self, context: int | None = None) -> torch.Tensor:
        """One buffer: page-locked through `self.staging` (registered with CUDA context `context`, else
        torch's pinned allocator), pageable with alignment slack where both refused or when not pinning."""
        raw = self.staging.allocate(self._chunk, context) if self._pin else None
        if raw is None or raw.data_ptr() % ALIGN:
            raw = torch.empty(self._chunk + ALIGN, dtype=torch.uint8)
        if self._cuda:
            self.stats.staging = self.staging.path if self._pin else "pageable"
            self.stats.staging_note = self.staging.note
        return raw

    def _submit(self, chunk: Chunk, buf: torch.Tensor) -> list:
        """Queue the reads filling `buf` with `chunk`: Futures on the pool, or reads on the io_uring queue."""
        fd, direct = self._files.fd_for(chunk.file)
        lo = chunk.lo - chunk.lo % ALIGN if direct else chunk.lo
        hi = min(-(-chunk.end // ALIGN) * ALIGN, self._chunk) if direct else chunk.end
        self.stats.direct_chunks += direct
        self.stats.bytes += chunk.end - chunk.lo
        parts = self._split(lo, hi, chunk.end)
        if self._queue is not None:
            base, queue, reads = buf.data_ptr(), self._queue, []
            for part in parts:
                a, b, _ = part
                read_id = queue.submit(fd, chunk.start + a, base + a, b - a, worker=not direct)
                reads.append(QueuedRead(queue, self._files, read_id, fd, direct, chunk, buf, part))
            queue.flush()
            return reads
        view, name = memoryview(buf.numpy()), chunk_name(chunk)
        args = [(fd, direct, chunk, view[a:b], needed - a, a, name) for a, b, needed in parts]
        if self._pool is None:
            for a in args:
                self._read(*a)
            return []
        return [self._pool.submit(self._read, *a) for a in args]

    def _split(self, lo: int, hi: int, needed: int) -> list[tuple[int, int, int]]:
        """[lo, hi) in parts of `read_bytes` on ALIGN boundaries: (start, end, needed end)."""
        bounds = _starts(lo, hi, self._read_bytes) + [hi]
        return [(a, b, min(b, needed)) for a, b in zip(bounds, bounds[1:])]

    def _read(self, fd: int, direct: bool, chunk: Chunk, view: memoryview, needed: int, at: int, name: str) -> None:
        try:
            read_chunk(fd, chunk.start + at, view, needed, name=name)
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                raise
            read_chunk(self._files.fallback(chunk.file), chunk.start + at, view, needed, name=name)

    def _make_room(self) -> None:
        """Free a buffer, or move the pipeline on so one frees: a buffer whose copies have passed is
        taken at once; while fewer than COPY_QUEUE buffers' copies are queued, the oldest chunk's reads
        are waited for and its copies queued (feeding the copy engine); otherwise the oldest copy."""
        if self._copying and self._events[self._copying[0]].query():
            self._free.append(self._copying.popleft())
        elif self._flight and len(self._copying) < COPY_QUEUE:
            self._retire()
        else:  # every buffer is being read or copied out, so with none in flight, copies are queued
            t = time.perf_counter()
            self._events[self._copying[0]].synchronize()
            self.stats.copy_wait += time.perf_counter() - t
            self._free.append(self._copying.popleft())

    def _retire(self) -> None:
        """Wait for the oldest chunk's reads, queue its copies, and hand finished sources back."""
        chunk, k, reads = self._flight.popleft()
        t = time.perf_counter()
        if self._queue is not None:
            self._queue.complete(r.read_id for r in reads)
        for f in reads:
            f.result()
        t2 = time.perf_counter()
        self.stats.read_wait += t2 - t
        buf = self._buffers[k]
        self._files.chunk_read(chunk.file, chunk.start + chunk.lo, chunk.end - chunk.lo)
        if self._cuda:
            s = k % len(self._streams)
            stream, copier = self._streams[s], self._copiers[s]
            if copier is not None:
                base = buf.data_ptr()
                for piece, at, into, n, _ in chunk.parts:
                    try:
                        copier.copy(piece.out.data_ptr() + into, base + at, n)
                    except PlacementError as exc:
                        raise PlacementError(f"{echo_name(piece.meta.file)}: tensor {echo(piece.meta.name, NAME_LIMIT)}: {exc}") from None
            else:
                with torch.cuda.stream(stream):
                    for piece, at, into, n, _ in chunk.parts:
                        piece.out[into : into + n].copy_(buf[at : at + n], non_blocking=True)
            self._events[k].record(stream)
            self._copying.append(k)
        else:
            for piece, at, into, n, _ in chunk.parts:
                piece.out[into : into + n].copy_(buf[at : at + n])
            self._free.append(k)
        t3 = time.perf_counter()
        self.stats.copy_issue += t3 - t2
        for piece, _, _, _, last in chunk.parts:
            if last:
                piece.done()
        self.stats.place += time.perf_counter() - t3
