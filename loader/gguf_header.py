"""One GGUF file's header, read with bounds: its tensors' names, types, shapes and bytes, nothing of the data.

GGUF (llama.cpp's format, and the quantized DiTs derived from Comfy-Org's single files) puts a small
header before the data: the magic `GGUF`, a version, key/value metadata, then per tensor its name,
dimensions (innermost first), quantization type and offset into the data area. Reading it here, with no
dependency, lets a forecast count a quantized DiT's real bytes and a listing name its quant type without
the optional `gguf` package and without touching the weights. The file is opened confined to the model
roots, and every count, length and offset is bounded before it is trusted, so a truncated or crafted
header ends in one line naming the file and what was wrong, never in a huge allocation.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from core.echo import echo_name
from core.errors import CheckpointError
from .confined import CheckedFile, open_checked, read_at_most
from .roots import ModelRoots

GGUF_MAGIC = b"GGUF"
VERSIONS = (2, 3)
"""GGUF versions read (64-bit counts); version 1 predates them."""
MAX_HEADER_BYTES = 64 * 1024 * 1024
"""Most header bytes read (a DiT's header takes a few hundred KB; a larger one is corrupt or crafted)."""
MAX_TENSORS = 1 << 20
MAX_DIMS = 4
"""GGML tensors have at most four dimensions."""
DEFAULT_ALIGNMENT = 32
"""The data area's alignment when `general.alignment` does not say."""

QUANT_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36),
}
"""GGML type id -> (name, elements per block, bytes per block): the GGUF specification's facts."""
UNQUANTIZED = ("F32", "F16")
"""Types diffusers loads as plain tensors; every other type stays packed (`GGUFParameter`)."""

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
"""GGUF metadata value types of fixed size (8 is a string, 9 an array)."""
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GgufTensor:
    """One tensor as the GGUF header describes it."""

    name: str
    quant_type: str
    """The GGML type's name (`Q8_0`, `F32`, `type 99` when unknown)."""
    shape: tuple[int, ...]
    """torch's order (outermost first): GGUF lists dimensions innermost first."""
    offset: int
    """Absolute file offset of its first byte."""
    nbytes: int
    """Bytes on disk (packed blocks for a quantized type; 0 when the type is unknown)."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class GgufHeader:
    """A GGUF file's header: version, tensors, and where the data lies."""

    path: Path
    version: int
    tensors: tuple[GgufTensor, ...]
    data_start: int
    file_size: int
    checked: CheckedFile
    """The file as it was opened: what a load reopens, so it reads the file this header came from."""

    def bytes_by_type(self) -> dict[str, int]:
        """Bytes on disk per quant type, largest first."""
        totals: dict[str, int] = {}
        for t in self.tensors:
            totals[t.quant_type] = totals.get(t.quant_type, 0) + t.nbytes
        return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


class _Reader:
    """Sequential little-endian reads of the header from a descriptor, bounded by MAX_HEADER_BYTES."""

    CHUNK = 1 << 20

    def __init__(self, fd: int, name: str, size: int):
        self.fd, self.name, self.size, self.pos = fd, name, size, 0
        self.buffer, self.buffer_start = b"", 0
        self.what = "the magic"

    def take(self, n: int) -> bytes:
        if self.pos + n > min(self.size, MAX_HEADER_BYTES):
            if self.pos + n > self.size:
                raise CheckpointError(f"{self.name}: truncated GGUF header: the file ends at byte {self.size:,} "
                                      f"inside {self.what}")
            raise CheckpointError(f"{self.name}: GGUF header longer than the {MAX_HEADER_BYTES:,}-byte limit "
                                  f"(at {self.what}); corrupt or crafted")
        if self.pos + n > self.buffer_start + len(self.buffer):
            self.buffer, self.buffer_start = read_at_most(self.fd, max(n, self.CHUNK), self.pos), self.pos
        data = self.buffer[self.pos - self.buffer_start:self.pos - self.buffer_start + n]
        if len(data) < n:
            raise CheckpointError(f"{self.name}: truncated GGUF header: the file ends inside {self.what}")
        self.pos += n
        return data

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        length = self.scalar("<Q")
        raw = self.take(length)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointError(f"{self.name}: {self.what} is not UTF-8; corrupt GGUF header") from None

    def value(self, kind: int) -> object:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item == _ARRAY:
                raise CheckpointError(f"{self.name}: {self.what} is an array of arrays; refused")
            if item in _SCALARS:  # skipped, not parsed: a listing never needs a tokenizer's scores
                self.take(count * struct.calcsize(_SCALARS[item]))
                return None
            for _ in range(count):
                self.value(item)
            return None
        raise CheckpointError(f"{self.name}: {self.what} has unknown value type {kind}; corrupt GGUF header")


def is_gguf(path: Path) -> bool:
    """Whether `path` names a GGUF file: its suffix decides (as diffusers' own loader decides)."""
    return path.suffix.lower() == ".gguf"


def read_gguf_header(path: Path, roots: ModelRoots | None = None) -> GgufHeader:
    """The header of the GGUF file at `path`, opened confined to `roots` (default: its folder); any problem
    is one CheckpointError naming the file, the tensor and what was expected."""
    name = echo_name(path.name)
    fd, checked = open_checked(path, roots or ModelRoots([path.parent]), name)
    try:
        return _parse(fd, path, name, checked)
    finally:
        os.close(fd)


def _parse(fd: int, path: Path, name: str, checked: CheckedFile) -> GgufHeader:
    r = _Reader(fd, name, checked.size)
    magic = r.take(4)
    if magic != GGUF_MAGIC:
        raise CheckpointError(f"{name}: not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}); a .gguf "
                              f"file must be GGUF")
    r.what = "the version"
    version = r.scalar("<I")
    if version not in VERSIONS:
        raise CheckpointError(f"{name}: GGUF version {version}; versions {' and '.join(map(str, VERSIONS))} are read")
    r.what = "the counts"
    count, kv_count = r.scalar("<Q"), r.scalar("<Q")
    if count > MAX_TENSORS:
        raise CheckpointError(f"{name}: claims {count:,} tensors, more than the {MAX_TENSORS:,} accepted; corrupt")
    alignment = DEFAULT_ALIGNMENT
    for i in range(kv_count):
        r.what = f"metadata entry {i}"
        key = r.string()
        r.what = f"metadata {echo_name(key)}"
        value = r.value(r.scalar("<I"))
        if key == "general.alignment":
            if not isinstance(value, int) or value <= 0 or value & (value - 1):
                raise CheckpointError(f"{name}: general.alignment {value!r} is not a power of two")
            alignment = value
    infos = []
    for i in range(count):
        r.what = f"tensor info {i}"
        tname = r.string()
        r.what = f"tensor {echo_name(tname)}"
        n_dims = r.scalar("<I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise CheckpointError(f"{name}: tensor {echo_name(tname)} has {n_dims} dimensions; GGUF allows 1 to {MAX_DIMS}")
        dims = [r.scalar("<Q") for _ in range(n_dims)]
        infos.append((tname, dims, r.scalar("<I"), r.scalar("<Q")))
    data_start = -(-r.pos // alignment) * alignment
    tensors = tuple(_tensor(name, alignment, data_start, *info) for info in infos)
    _check_layout(name, tensors, checked.size)
    return GgufHeader(path, version, tensors, data_start, checked.size, checked)


def _tensor(name: str, alignment: int, data_start: int, tname: str, dims: list[int], kind: int,
            offset: int) -> GgufTensor:
    label = f"{name}: tensor {echo_name(tname)}"
    if any(d <= 0 or d >= 2**62 for d in dims):
        raise CheckpointError(f"{label} has dimensions {dims}; each must be positive")
    if offset % alignment:
        raise CheckpointError(f"{label} starts at data offset {offset:,}, not a multiple of the alignment {alignment}")
    type_name, block, type_size = QUANT_TYPES.get(kind, (f"type {kind}", 0, 0))
    numel = math.prod(dims)
    if block and dims[0] % block:
        raise CheckpointError(f"{label}: {type_name} packs {block} values per block, but its rows hold {dims[0]}")
    nbytes = numel // block * type_size if block else 0
    return GgufTensor(tname, type_name, tuple(reversed(dims)), data_start + offset, nbytes)


def _check_layout(name: str, tensors: tuple[GgufTensor, ...], file_size: int) -> None:
    """Names unique; the tensors' bytes lie inside the file and do not overlap."""
    seen: set[str] = set()
    end, previous = 0, None
    for t in sorted(tensors, key=lambda t: t.offset):
        if t.name in seen:
            raise CheckpointError(f"{name}: tensor {echo_name(t.name)} is listed twice")
        seen.add(t.name)
        if t.offset < end:
            raise CheckpointError(f"{name}: tensor {echo_name(t.name)} overlaps {echo_name(previous)}")
        end, previous = t.offset + t.nbytes, t.name
        if end > file_size:
            raise CheckpointError(f"{name}: truncated: tensor {echo_name(t.name)} ({t.quant_type} {t.shape}) ends at byte "
                                  f"{end:,}, past the file's end at {file_size:,}")
