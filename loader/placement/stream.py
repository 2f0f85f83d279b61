"""`stream` (the default): no dict, no mmap; positioned reads straight into the destination.

On a CPU target in the checkpoint's dtype the bytes are read directly into
the freshly allocated parameter, each piece's pages faulted in with one call
before its read, split over a few threads so the reads overlap. When the dtype changes, or the target is a device,
bytes go through a few small reusable staging buffers (pinned on CUDA) in a
pipeline: while the oldest filled buffer is copied to the destination (on a
side stream on CUDA), the reads of the next buffers are already in flight, and
the kernel is asked (POSIX_FADV_WILLNEED) to fetch the file range just ahead
of them, so a cold disk never waits between buffers. Each shard's file
descriptor is closed once its last tensor is read.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from ..checkpoint import TensorMeta
from ..errors import PlacementError
from ..reading import advice_step, advise_willneed, byte_view, read_into_fresh, submit_parts
from .base import LoadPlan, Placement, PlacementContext, PlannedTarget, register_placement

_MiB = 1024 * 1024


class _OpenFiles:
    """File descriptors opened on first use and closed after the last planned read from them,
    with how far ahead the kernel was already asked to read each one."""

    def __init__(self, plan: LoadPlan, readahead: int):
        self._remaining: dict[Path, int] = {}
        for planned in plan.targets:
            for meta in planned.sources:
                self._remaining[meta.file] = self._remaining.get(meta.file, 0) + 1
        self._fds: dict[Path, int] = {}
        self._readahead = readahead
        self._advised: dict[Path, tuple[int, int]] = {}
        """Per open file, the byte range [start, end) already handed to POSIX_FADV_WILLNEED."""
        self._step = 0

    def fd(self, meta: TensorMeta) -> int:
        fd = self._fds.get(meta.file)
        if fd is None:
            fd = self._fds[meta.file] = os.open(meta.file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return fd

    def ahead(self, meta: TensorMeta, offset: int, length: int) -> None:
        """Before reading [offset, offset + length) of `meta`'s file, have the kernel fetch it and
        `readahead` bytes past it (only what earlier calls did not already cover)."""
        if self._readahead == 0 or not hasattr(os, "posix_fadvise"):
            return
        fd = self.fd(meta)
        if not self._step:
            self._step = advice_step(fd)
        start, end = self._advised.get(meta.file, (0, 0))
        if not start <= offset <= end:
            start = end = offset
        target = offset + length + self._readahead
        if target > end:
            advise_willneed(fd, end, target, self._step)
            self._advised[meta.file] = (start, target)

    def done(self, meta: TensorMeta) -> None:
        self._remaining[meta.file] -= 1
        if self._remaining[meta.file] == 0 and meta.file in self._fds:
            os.close(self._fds.pop(meta.file))
            self._advised.pop(meta.file, None)

    def close_all(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])
        self._advised.clear()


@register_placement("stream")
class StreamPlacement(Placement):
    """Positioned reads into the destination; bounded staging when converting or copying to a device."""

    options = ("threads", "read_bytes", "staging_bytes", "staging_buffers", "readahead_bytes", "pin")

    def __init__(self, **options):
        super().__init__(**options)
        # One reader per core up to 8: two saturate this kind of 2-core box, a 16-core GPU host
        # needs more to keep ahead of a 55 GB/s host-to-device copy.
        self.threads = _positive(options, "threads", max(2, min(8, os.cpu_count() or 2)))
        self.read_bytes = _positive(options, "read_bytes", 16 * _MiB)
        self.staging_bytes = _positive(options, "staging_bytes", 32 * _MiB)
        self.staging_buffers = _positive(options, "staging_buffers", 4)
        self.readahead_bytes = _positive(options, "readahead_bytes", 64 * _MiB, minimum=0)
        self.pin = bool(options.get("pin", True))

    def place(self, plan: LoadPlan, ctx: PlacementContext) -> None:
        files = _OpenFiles(plan, self.readahead_bytes)
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="drainboard-read") if self.threads > 1 else None
        direct = {
            p.name: ctx.device.type == "cpu" and all(m.torch_dtype == p.dtype for m in p.sources) for p in plan.targets
        }
        largest = max((m.nbytes for p in plan.targets if not direct[p.name] for m in p.sources), default=0)
        staging = _Staging(self, ctx.device, pool, files, min(self.staging_bytes, largest))
        pending: deque[tuple[PlannedTarget, torch.Tensor, list[Future]]] = deque()
        try:
            for planned in plan.targets:
                dest = ctx.allocate(planned)
                if direct[planned.name]:
                    staging.drain()
                    pending.append((planned, dest, self._submit_direct(planned, dest, files, pool)))
                    while len(pending) > 1 and sum(p[0].nbytes for p in pending) > 8 * self.read_bytes:
                        self._finish(pending.popleft(), files, ctx)
                    continue
                while pending:
                    self._finish(pending.popleft(), files, ctx)
                flat = dest.view(-1)
                start = 0
                for i, meta in enumerate(planned.sources):
                    last = i == len(planned.sources) - 1
                    done = partial(self._staged_read, meta, files, ctx, (planned, dest) if last else None)
                    staging.copy(meta, flat[start : start + meta.numel], done)
                    start += meta.numel
            while pending:
                self._finish(pending.popleft(), files, ctx)
            staging.drain()
        finally:
            for _, _, futures in pending:
                for f in futures:
                    f.cancel()
            staging.cancel()
            if pool is not None:
                pool.shutdown(wait=True)
            staging.release()
            files.close_all()

    def _submit_direct(
        self, planned: PlannedTarget, dest: torch.Tensor, files: _OpenFiles, pool: ThreadPoolExecutor | None
    ) -> list[Future]:
        """Queue reads of every source into its slice of `dest`, in `read_bytes` pieces."""
        futures: list[Future] = []
        flat = dest.view(-1)
        start = 0
        for meta in planned.sources:
            view = byte_view(flat[start : start + meta.numel])
            start += meta.numel
            fd, name = files.fd(meta), f"{meta.file.name}: tensor {meta.name!r}"
            for lo in range(0, len(view), self.read_bytes):
                piece = view[lo : lo + self.read_bytes]
                if pool is None:
                    read_into_fresh(fd, meta.offset + lo, piece, name=name)
                else:
                    futures.append(pool.submit(read_into_fresh, fd, meta.offset + lo, piece, name=name))
        return futures

    def _finish(self, item: tuple[PlannedTarget, torch.Tensor, list[Future]], files: _OpenFiles, ctx: PlacementContext) -> None:
        planned, dest, futures = item
        for f in futures:
            f.result()
        for meta in planned.sources:
            ctx.meter.read(meta.nbytes)
            files.done(meta)
        ctx.place(planned, dest)

    @staticmethod
    def _staged_read(
        meta: TensorMeta, files: _OpenFiles, ctx: PlacementContext, placed: tuple[PlannedTarget, torch.Tensor] | None
    ) -> None:
        """All of `meta`'s bytes have left its file: count them, maybe close it, place the target after its last source."""
        ctx.meter.read(meta.nbytes)
        files.done(meta)
        if placed is not None:
            ctx.place(*placed)


@dataclass
class _Chunk:
    """One staging buffer's worth of a source: being read, then copied out."""

    buffer: int
    """Index of the staging buffer the bytes are read into."""
    reads: list[Future]
    """The positioned reads filling the buffer (empty when read inline)."""
    source: torch.Tensor
    """The filled part of the buffer, viewed in the source dtype."""
    out: torch.Tensor
    """Where the bytes go: a 1-D slice of the destination."""
    on_read: Callable[[], None] | None
    """Called once the buffer is filled, for a source's last chunk."""


class _Staging:
    """A few reusable host buffers that source bytes pass through on their way to the destination.

    Chunks go through the buffers in turn, as a pipeline: up to all but one
    buffer are being read while the oldest filled one is copied out, so the
    disk queue never drains at a buffer boundary. Each buffer's read is split
    so the buffers being read keep every reader thread busy. On CUDA the
    buffers are pinned (pageable if pinning fails), each copy to the device
    runs on a side stream, and a buffer is refilled only after its copy has
    finished.
    """

    def __init__(self, owner: StreamPlacement, device: torch.device, pool: ThreadPoolExecutor | None, files: _OpenFiles, size: int):
        self._owner = owner
        self._size = max(size, 1)
        """Bytes per buffer: the staging_bytes option, or less when no source needs that much."""
        self._device = device
        self._pool = pool
        self._files = files
        self._buffers: list[torch.Tensor] = []
        self._events: list = []
        self._next = 0
        self._flight: deque[_Chunk] = deque()
        self._cuda = device.type == "cuda"
        self._stream = None
        self._device_stage: torch.Tensor | None = None
        count = owner.staging_buffers
        self._parts = -(-owner.threads // max(count - 1, 1))
        """Pieces each buffer's read is split into, so count - 1 buffers in flight use every thread."""
        self.pinned = False
        """Whether the host buffers ended up pinned."""

    def _ensure(self) -> None:
        if self._buffers:
            return
        size, count = self._size, self._owner.staging_buffers
        if self._cuda:
            self._stream = torch.cuda.Stream(self._device)
            self._stream.wait_stream(torch.cuda.current_stream(self._device))
            self.pinned = self._owner.pin
        for _ in range(count):
            self._buffers.append(self._host_buffer(size))
            self._events.append(None)

    def _host_buffer(self, size: int) -> torch.Tensor:
        if self.pinned:
            try:
                return torch.empty(size, dtype=torch.uint8, pin_memory=True)
            except RuntimeError:
                self.pinned = False
        return torch.empty(size, dtype=torch.uint8)

    def copy(self, meta: TensorMeta, out: torch.Tensor, on_read: Callable[[], None]) -> None:
        """Queue reading `meta` and writing it, converted to `out`'s dtype, into `out` (1-D).

        Returns once the reads are queued; `on_read` runs after the last byte
        has been read (the copy into `out` may still be running until `drain`).
        """
        self._ensure()
        itemsize = meta.torch_dtype.itemsize
        step = max(self._size // itemsize, 1) * itemsize
        name = f"{meta.file.name}: tensor {meta.name!r}"
        fd = self._files.fd(meta)
        for lo in range(0, meta.nbytes, step):
            n = min(step, meta.nbytes - lo)
            while self._flight and len(self._flight) >= max(len(self._buffers) - 1, 1):
                self._copy_oldest()
            k = self._next
            self._next = (k + 1) % len(self._buffers)
            if self._events[k] is not None:
                self._events[k].synchronize()
                self._events[k] = None
            host = self._buffers[k][:n]
            self._files.ahead(meta, meta.offset + lo, n)
            reads = submit_parts(fd, meta.offset + lo, host, self._pool, parts=self._parts, name=name)
            last = lo + n >= meta.nbytes
            part = out[lo // itemsize : (lo + n) // itemsize]
            self._flight.append(_Chunk(k, reads, host.view(meta.torch_dtype), part, on_read if last else None))

    def _copy_oldest(self) -> None:
        chunk = self._flight.popleft()
        for f in chunk.reads:
            f.result()
        if self._cuda:
            self._events[chunk.buffer] = self._copy_cuda(chunk.source, chunk.out)
        else:
            chunk.out.copy_(chunk.source)
        if chunk.on_read is not None:
            chunk.on_read()

    def _copy_cuda(self, source: torch.Tensor, part: torch.Tensor):
        with torch.cuda.stream(self._stream):
            if source.dtype == part.dtype:
                part.copy_(source, non_blocking=True)
            else:
                if self._device_stage is None:
                    self._device_stage = torch.empty(self._size, dtype=torch.uint8, device=self._device)
                stage = self._device_stage[: source.numel() * source.element_size()].view(source.dtype)
                stage.copy_(source, non_blocking=True)
                part.copy_(stage)
            event = torch.cuda.Event()
            event.record(self._stream)
        return event

    def drain(self) -> None:
        """Finish every queued chunk: all reads done, all copies out of the buffers complete."""
        while self._flight:
            self._copy_oldest()
        if self._stream is not None:
            self._stream.synchronize()

    def cancel(self) -> None:
        """Drop queued chunks after a failure (reads not yet started are cancelled)."""
        while self._flight:
            for f in self._flight.popleft().reads:
                f.cancel()

    def release(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
        self._buffers.clear()
        self._events.clear()
        self._device_stage = None


def _positive(options: dict, key: str, default: int, *, minimum: int = 1) -> int:
    value = options.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise PlacementError(f"placement mode 'stream' option {key} must be {kind}, got {value!r}")
    return value
