"""GGUF files written by hand from the format's specification (magic, version, counts, metadata, tensor
infos, aligned data), so the header reader is tested against the format, not against itself, and any
field can be made wrong."""

from __future__ import annotations

import struct
from pathlib import Path

SIZES = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144), "IQ2_XXS": (16, 256, 66)}
"""Type name -> (GGML id, elements per block, bytes per block)."""


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf_bytes(tensors: list[tuple[str, tuple[int, ...], str]], *, alignment: int = 32, version: int = 3,
               magic: bytes = b"GGUF") -> bytes:
    """A GGUF file of `tensors`, each (name, torch shape, type name), its data zero bytes; the metadata holds
    `general.architecture` and `general.alignment` (a string and a u32)."""
    infos, offset, sizes = b"", 0, []
    for name, shape, kind in tensors:
        type_id, block, type_size = SIZES[kind]
        numel = 1
        for d in shape:
            numel *= d
        infos += _string(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in reversed(shape))
        infos += struct.pack("<IQ", type_id, offset)
        size = numel // block * type_size
        sizes.append(size)
        offset += -(-size // alignment) * alignment
    metadata = (_string("general.architecture") + struct.pack("<I", 8) + _string("minimax_h3")
                + _string("general.alignment") + struct.pack("<II", 4, alignment))
    head = magic + struct.pack("<IQQ", version, len(tensors), 2) + metadata + infos
    head += bytes(-len(head) % alignment)
    return head + bytes(offset)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def require_gguf():
    """The optional `gguf` package, or a skip; with DRAINBOARD_REQUIRE_GGUF=1 (CI installs the extra) a
    missing package fails the test instead, so no skip hides a missing feature there."""
    import os

    import pytest

    try:
        import gguf
    except ImportError:
        if os.environ.get("DRAINBOARD_REQUIRE_GGUF") == "1":
            raise
        pytest.skip("gguf is the optional GGUF extra (requirements-gguf.txt); CI runs these with it")
    return gguf
