"""How the ring's chunks are read: positioned reads that name the file on a short read, and one
io_uring read waited for like a Future, falling back to a buffered descriptor where O_DIRECT is refused."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import torch

from core.errors import CheckpointError
from ..io.uring import ReadQueue
from .chunks import Chunk, chunk_name

class FileHandles:
    """What the ring reads through: per file a descriptor, O_DIRECT or buffered, and per-range upkeep."""

    def fd_for(self, file: Path) -> tuple[int, bool]:
        """(descriptor, whether it is O_DIRECT) for reading chunks of `file`."""
        raise NotImplementedError

    def fallback(self, file: Path) -> int:
        """A buffered descriptor after an O_DIRECT read was refused; later chunks use it too."""
        raise NotImplementedError

    def chunk_read(self, file: Path, offset: int, length: int) -> None:
        """[offset, offset + length) of `file` now sits in a buffer (drop it from the page cache if asked)."""


def read_chunk(fd: int, offset: int, view: memoryview, needed: int, *, name: str) -> None:
    """Fill `view` from `fd` at `offset`; at least `needed` bytes must exist (the rest may lie past EOF)."""
    done, total = 0, len(view)
    while done < total:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    if done < needed:
        raise CheckpointError(f"{name}: file ended after {done} of {needed} bytes at offset {offset} (truncated?)")


class QueuedRead:
    """One part's read on the io_uring queue, waited for like a Future.

    The memoryview a short or refused read needs is built only then: the
    loader's thread queues about 4,800 of these for a 37 GiB model.
    """

    def __init__(
        self, queue: ReadQueue, files: FileHandles, read_id: int, fd: int, direct: bool, chunk: Chunk,
        buf: torch.Tensor, part: tuple[int, int, int],
    ):
        self._queue, self._files, self.read_id, self._fd, self._direct = queue, files, read_id, fd, direct
        self._chunk, self._buf, self._part = chunk, buf, part

    def result(self) -> None:
        chunk, fd, direct = self._chunk, self._fd, self._direct
        a, b, needed = self._part
        try:
            got = self._queue.wait(self.read_id)
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                raise OSError(exc.errno, exc.strerror, str(chunk.file)) from None
            got = 0
            fd = self._files.fallback(chunk.file)
        if got < needed - a:  # a refused O_DIRECT read, a short read, or a truncated file (which read_chunk names)
            if direct and got:
                fd = self._files.fallback(chunk.file)
            view = memoryview(self._buf.numpy())[a + got : b]
            read_chunk(fd, chunk.start + a + got, view, needed - a - got, name=chunk_name(chunk))

    def cancel(self) -> bool:
        return False
