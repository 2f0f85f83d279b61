"""What the CUDA ring reads: pieces of tensors grouped into aligned, buffer-sized chunks of contiguous file bytes.

Pure planning, no I/O: the ring (`ranges.RangeRing`) fills one buffer per chunk.
"""

from __future__ import annotations

from core.echo import NAME_LIMIT, echo, echo_name
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..metadata import TensorMeta

ALIGN = 4096
"""O_DIRECT needs buffer address, file offset and length on this boundary (the logical block size
of every disk seen so far is 512 or 4096)."""


@dataclass(frozen=True)
class Piece:
    """One source's bytes and where they go."""

    meta: TensorMeta
    """The source tensor (its file and offset)."""
    out: torch.Tensor
    """1-D uint8 view of the destination bytes (CUDA or CPU)."""
    done: Callable[[], None]
    """Called on the main thread once every byte of the source has been read and its copy queued."""


@dataclass
class Chunk:
    """One buffer's worth of one file: [start + lo, start + end) holds piece data."""

    file: Path
    start: int
    """File offset of buffer byte 0 (aligned)."""
    lo: int = 0
    """First buffer byte that holds piece data."""
    end: int = 0
    """One past the last buffer byte that holds piece data."""
    parts: list[tuple[Piece, int, int, int, bool]] = field(default_factory=list)
    """(piece, offset in buffer, offset in piece, bytes, last part of the piece)."""


def plan_chunks(pieces: Iterable[Piece], chunk_bytes: int) -> Iterator[Chunk]:
    """Group pieces, in order, into buffer-sized chunks of contiguous file bytes.

    A chunk starts on an ALIGN boundary at or below its first byte and covers
    at most `chunk_bytes` of the file from there; a piece that does not start
    where the previous one ended (another file, a gap of unread tensors)
    starts a new chunk, so nothing between planned tensors is read.
    """
    current: Chunk | None = None
    for piece in pieces:
        pos, left, into = piece.meta.offset, piece.meta.nbytes, 0
        while True:
            contiguous = current is not None and current.file == piece.meta.file and pos == current.start + current.end
            if not contiguous or current.end >= chunk_bytes:
                if current is not None:
                    yield current
                base = pos - pos % ALIGN
                current = Chunk(piece.meta.file, base, pos - base, pos - base)
            n = min(left, chunk_bytes - current.end)
            current.parts.append((piece, current.end, into, n, n == left))
            current.end += n
            pos, left, into = pos + n, left - n, into + n
            if left == 0:
                break
    if current is not None:
        yield current


def chunk_name(chunk: Chunk) -> str:
    """How errors name a chunk: its file and first tensor."""
    return f"{echo_name(chunk.file.name)}: tensor {echo(chunk.parts[0][0].meta.name, NAME_LIMIT)}"
