"""Per-tensor staging: source bytes through a few reusable host buffers, converted on the way.

`stream` uses it where a tensor changes dtype (on any device) and on CPU
targets: the chunks of one source go through the buffers in turn, each read
split over the reader threads, each copied (and converted) into its slice of
the destination while the next buffers are already being read.
"""

from __future__ import annotations

from core.echo import NAME_LIMIT, echo, echo_name
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ..metadata import TensorMeta
from ..io.reading import submit_parts
from .files import OpenFiles


@dataclass
class StagedChunk:
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


class Staging:
    """A few reusable host buffers that source bytes pass through on their way to the destination.

    Chunks go through the buffers in turn, as a pipeline: up to all but one
    buffer are being read while the oldest filled one is copied out, so the
    disk queue never drains at a buffer boundary. Each buffer's read is split
    so the buffers being read keep every reader thread busy. On CUDA the
    buffers are pinned (pageable if pinning fails), each copy to the device
    runs on a side stream, and a buffer is refilled only after its copy has
    finished.
    """

    def __init__(
        self,
        device: torch.device,
        pool: ThreadPoolExecutor | None,
        files: OpenFiles,
        size: int,
        *,
        buffers: int,
        threads: int,
        pin: bool,
    ):
        self._size = max(size, 1)
        """Bytes per buffer: the staging_bytes option, or less when no source needs that much."""
        self._device = device
        self._pool = pool
        self._files = files
        self._buffers: list[torch.Tensor] = []
        self._events: list = []
        self._next = 0
        self._flight: deque[StagedChunk] = deque()
        self._cuda = device.type == "cuda"
        self._stream = None
        self._device_stage: torch.Tensor | None = None
        self._count = buffers
        self._pin = pin
        self._parts = -(-threads // max(buffers - 1, 1))
        """Pieces each buffer's read is split into, so count - 1 buffers in flight use every thread."""
        self.pinned = False
        """Whether the host buffers ended up pinned."""

    def _ensure(self) -> None:
        if self._buffers:
            return
        size = self._size
        if self._cuda:
            self._stream = torch.cuda.Stream(self._device)
            self._stream.wait_stream(torch.cuda.current_stream(self._device))
            self.pinned = self._pin
        for _ in range(self._count):
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
        has been read (the copy into `out` may still be running until `finish`).
        """
        self._ensure()
        itemsize = meta.torch_dtype.itemsize
        step = max(self._size // itemsize, 1) * itemsize
        name = f"{echo_name(meta.file.name)}: tensor {echo(meta.name, NAME_LIMIT)}"
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
            self._flight.append(StagedChunk(k, reads, host.view(meta.torch_dtype), part, on_read if last else None))

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

    def finish(self) -> None:
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
