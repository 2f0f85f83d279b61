"""`stream` (the default): no dict, no mmap; positioned reads straight into the destination.

On a CPU target in the checkpoint's dtype the bytes are read directly into
the freshly allocated parameter, each piece's pages faulted in with one call
before its read, split over a few threads so the reads overlap. When the dtype changes, or the target is a device,
bytes go through a few small reusable staging buffers: pinned on CUDA, where
the host-to-device copy of one buffer runs on a side stream while the next
buffer is read. Each shard's file descriptor is closed once its last tensor
is read.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from ..checkpoint import TensorMeta
from ..errors import PlacementError
from ..reading import byte_view, read_into_fresh, read_parallel
from .base import LoadPlan, Placement, PlacementContext, PlannedTarget, register_placement

_MiB = 1024 * 1024


class _OpenFiles:
    """File descriptors opened on first use and closed after the last planned read from them."""

    def __init__(self, plan: LoadPlan):
        self._remaining: dict[Path, int] = {}
        for planned in plan.targets:
            for meta in planned.sources:
                self._remaining[meta.file] = self._remaining.get(meta.file, 0) + 1
        self._fds: dict[Path, int] = {}

    def fd(self, meta: TensorMeta) -> int:
        fd = self._fds.get(meta.file)
        if fd is None:
            fd = self._fds[meta.file] = os.open(meta.file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return fd

    def done(self, meta: TensorMeta) -> None:
        self._remaining[meta.file] -= 1
        if self._remaining[meta.file] == 0 and meta.file in self._fds:
            os.close(self._fds.pop(meta.file))

    def close_all(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])


@register_placement("stream")
class StreamPlacement(Placement):
    """Positioned reads into the destination; bounded staging when converting or copying to a device."""

    options = ("threads", "read_bytes", "staging_bytes", "staging_buffers", "pin")

    def __init__(self, **options):
        super().__init__(**options)
        # One reader per core up to 8: two saturate this kind of 2-core box, a 16-core GPU host
        # needs more to keep ahead of a 55 GB/s host-to-device copy.
        self.threads = _positive(options, "threads", max(2, min(8, os.cpu_count() or 2)))
        self.read_bytes = _positive(options, "read_bytes", 16 * _MiB)
        self.staging_bytes = _positive(options, "staging_bytes", 64 * _MiB)
        self.staging_buffers = _positive(options, "staging_buffers", 2)
        self.pin = bool(options.get("pin", True))

    def place(self, plan: LoadPlan, ctx: PlacementContext) -> None:
        files = _OpenFiles(plan)
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="drainboard-read") if self.threads > 1 else None
        direct = {
            p.name: ctx.device.type == "cpu" and all(m.torch_dtype == p.dtype for m in p.sources) for p in plan.targets
        }
        largest = max((m.nbytes for p in plan.targets if not direct[p.name] for m in p.sources), default=0)
        staging = _Staging(self, ctx.device, pool, min(self.staging_bytes, largest))
        pending: deque[tuple[PlannedTarget, torch.Tensor, list[Future]]] = deque()
        try:
            for planned in plan.targets:
                dest = ctx.allocate(planned)
                if direct[planned.name]:
                    pending.append((planned, dest, self._submit_direct(planned, dest, files, pool)))
                    while len(pending) > 1 and sum(p[0].nbytes for p in pending) > 8 * self.read_bytes:
                        self._finish(pending.popleft(), files, ctx)
                    continue
                while pending:
                    self._finish(pending.popleft(), files, ctx)
                flat = dest.view(-1)
                start = 0
                for meta in planned.sources:
                    staging.copy(files.fd(meta), meta, flat[start : start + meta.numel])
                    start += meta.numel
                    ctx.meter.read(meta.nbytes)
                    files.done(meta)
                ctx.place(planned, dest)
            while pending:
                self._finish(pending.popleft(), files, ctx)
            staging.synchronize()
        finally:
            for _, _, futures in pending:
                for f in futures:
                    f.cancel()
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


class _Staging:
    """A few reusable host buffers that source bytes pass through on their way to the destination.

    On CUDA the buffers are pinned (pageable if pinning fails) and each
    buffer's copy to the device runs on a side stream; a buffer is refilled
    only after its previous copy has finished, so reading the next buffer
    overlaps the previous copy.
    """

    def __init__(self, owner: StreamPlacement, device: torch.device, pool: ThreadPoolExecutor | None, size: int):
        self._owner = owner
        self._size = max(size, 1)
        """Bytes per buffer: the staging_bytes option, or less when no source needs that much."""
        self._device = device
        self._pool = pool
        self._buffers: list[torch.Tensor] = []
        self._events: list = []
        self._next = 0
        self._cuda = device.type == "cuda"
        self._stream = None
        self._device_stage: torch.Tensor | None = None
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

    def copy(self, fd: int, meta: TensorMeta, out: torch.Tensor) -> None:
        """Read `meta` from `fd` and write it, converted to `out`'s dtype, into `out` (1-D)."""
        self._ensure()
        itemsize = meta.torch_dtype.itemsize
        step = max(self._size // itemsize, 1) * itemsize
        name = f"{meta.file.name}: tensor {meta.name!r}"
        for lo in range(0, meta.nbytes, step):
            n = min(step, meta.nbytes - lo)
            k = self._next
            self._next = (k + 1) % len(self._buffers)
            if self._events[k] is not None:
                self._events[k].synchronize()
            host = self._buffers[k][:n]
            read_parallel(fd, meta.offset + lo, host, self._pool, parts=self._owner.threads, name=name)
            source = host.view(meta.torch_dtype)
            part = out[lo // itemsize : (lo + n) // itemsize]
            if self._cuda:
                self._events[k] = self._copy_cuda(host, source, part)
            else:
                part.copy_(source)

    def _copy_cuda(self, host: torch.Tensor, source: torch.Tensor, part: torch.Tensor):
        with torch.cuda.stream(self._stream):
            if source.dtype == part.dtype:
                part.copy_(source, non_blocking=True)
            else:
                if self._device_stage is None:
                    self._device_stage = torch.empty(self._size, dtype=torch.uint8, device=self._device)
                stage = self._device_stage[: host.numel()]
                stage.copy_(host, non_blocking=True)
                part.copy_(stage.view(source.dtype))
            event = torch.cuda.Event()
            event.record(self._stream)
        return event

    def synchronize(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    def release(self) -> None:
        self.synchronize()
        self._buffers.clear()
        self._events.clear()
        self._device_stage = None


def _positive(options: dict, key: str, default: int) -> int:
    value = options.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PlacementError(f"placement mode 'stream' option {key} must be a positive integer, got {value!r}")
    return value
