"""The safetensors format: a shard's header read with bounds, and files and component folders written streaming.

Reading (`read_shard_header`): 8 + header-length bytes, nothing of the data. A checkpoint's headers share one
budget (`HeaderBudget`), and every shape's element count and strides must fit torch's int64; messages name the
file and what was wrong, never the bytes read.

Writing (`write_safetensors`, `write_component`, `write_tensors`): the header (names, dtypes, shapes, offsets)
is computed from specs alone and written first; then each tensor's bytes come from a generator of chunks, one
tensor at a time, so memory stays at one chunk whatever the file size. `write_component` adds the shard naming
and index.json of a diffusers component folder; `write_tensors` does the same for tensors already in memory
(test and benchmark checkpoints).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from .confined import open_checked, read_at_most
from core.echo import NAME_LIMIT, echo, echo_name
from core.errors import CheckpointError
from core.jsonfile import JSONProblem, parse_json
from .metadata import ShardMeta, TensorMeta
from .dtypes import SAFETENSORS_DTYPES
from .roots import ModelRoots, RootEscape

MAX_HEADER_BYTES = 100 * 1024 * 1024
"""Largest header accepted (safetensors' own limit); a larger length means a corrupt file."""
MAX_CHECKPOINT_HEADER_BYTES = 64 * 1024 * 1024
"""Most header bytes read for one whole checkpoint (the H3 DiT's 639 tensors take about 100 KB)."""
INT64_MAX = 2**63 - 1
"""No element count or stride may pass it: torch sizes and strides are int64."""


@dataclass
class HeaderBudget:
    """Header bytes one discovery may still read: one budget for a whole checkpoint, not per shard, so
    many large crafted headers cost no more than one."""

    remaining: int = field(default_factory=lambda: MAX_CHECKPOINT_HEADER_BYTES)
    """Bytes left."""

    def take(self, name: str, length: int) -> str | None:
        """Spend `length` bytes, or the problem to report when the budget cannot cover them."""
        if length > self.remaining:
            return (f"{name}: its header would pass the {MAX_CHECKPOINT_HEADER_BYTES}-byte limit on all the headers"
                    " of one checkpoint (not safetensors, or crafted)")
        self.remaining -= length
        return None


def read_shard_header(
    path: Path, roots: ModelRoots | None = None, budget: HeaderBudget | None = None, *, entries: bool = True
) -> tuple[ShardMeta | None, list[str]]:
    """Parse one shard's header: (shard, problems). Reads 8 + header-length bytes only, from one
    descriptor opened confined to `roots` (default: the shard's own folder), which is what a load
    reopens and checks (`ShardMeta.checked`).

    Without `entries`, only (bytes, elements) per dtype are summed into `ShardMeta.dtype_totals` (no
    per-tensor description, no duplicate-key or int64 checks, the JSON's nesting bounded by the
    parser's own recursion limit): what a listing shows, at a fraction of the cost; never what a load uses.

    Messages name the file and what was wrong, never the bytes read (a file
    that is not safetensors must not leak its start as a "length").
    """
    name = echo_name(path.name)
    try:
        fd, checked = open_checked(path, roots or ModelRoots([path.parent]), name)
    except RootEscape:
        raise
    except CheckpointError as exc:
        return None, exc.messages()
    try:
        size = checked.size
        prefix = read_at_most(fd, 8)
        if len(prefix) < 8:
            return None, [f"{name}: file is {size} bytes, too short for a safetensors header length"]
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES:
            return None, [f"{name}: header length exceeds the {MAX_HEADER_BYTES}-byte limit (not safetensors, or corrupt)"]
        if 8 + length > size:
            return None, [f"{name}: header length runs past the end of the {size}-byte file (truncated?)"]
        over = (budget or HeaderBudget()).take(name, length)
        if over:
            return None, [over]
        raw = read_at_most(fd, length, 8)
    except OSError as exc:
        return None, [f"{name}: cannot read: {exc.strerror}"]
    finally:
        os.close(fd)
    try:
        header = parse_json(raw, strict=entries, bound_depth=entries)
    except JSONProblem as exc:
        return None, [f"{name}: header is {exc}"]
    if not isinstance(header, dict):
        return None, [f"{name}: header is a JSON {type(header).__name__}, expected an object"]
    shard = ShardMeta(path=path, size=size, data_start=8 + length, checked=checked)
    metadata = header.pop("__metadata__", None)
    problems = _metadata_problems(name, metadata)
    if not problems and metadata:
        shard.metadata = metadata
    if not entries:
        shard.refused_entries, reach = _sum_by_dtype(header, shard.dtype_totals)
        data_size, held = size - shard.data_start, sum(b for b, _ in shard.dtype_totals.values())
        if shard.refused_entries:
            problems.append(f"{name}: {shard.refused_entries} header entries do not describe a tensor")
        elif reach > data_size:
            problems.append(f"{name}: tensors reach byte {reach} of a {data_size}-byte data area (truncated?)")
        elif held != data_size:
            problems.append(f"{name}: tensors hold {held} bytes of a {data_size}-byte data area")
        return shard, problems
    for tname, entry in header.items():
        meta, problem = _parse_entry(shard, tname, entry)
        if problem:
            problems.append(problem)
            shard.refused_entries += 1
        else:
            shard.tensors.append(meta)
    return shard, problems


def _sum_by_dtype(header: dict, totals: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """Add each entry's (bytes, elements) to `totals` by dtype: (how many entries are not
    `{"dtype": str, "shape": [int...], "data_offsets": [begin, end]}`, the furthest end offset)."""
    refused = reach = 0
    for entry in header.values():
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            if type(dtype) is not str or type(begin) is not int or type(end) is not int or not begin <= end:
                raise TypeError
            elements = math.prod(shape)
            if type(elements) is not int or elements < 0:
                raise TypeError
        except (TypeError, KeyError, ValueError):
            refused += 1
            continue
        held, count = totals.get(dtype, (0, 0))
        totals[dtype] = (held + end - begin, count + elements)
        reach = end if end > reach else reach
    return refused, reach


_JSON_KINDS = {int: "a number", float: "a number", bool: "a boolean", str: "a string", list: "a list", dict: "an object", type(None): "null"}
"""Each type `json` builds, in JSON's own terms."""


def _metadata_problems(name: str, metadata: object) -> list[str]:
    """Why `__metadata__` is not what safetensors reads (absent, null, or an object of strings), or []."""
    if metadata is None:
        return []
    if type(metadata) is not dict:
        return [f"{name}: __metadata__ is not an object of strings but {_JSON_KINDS[type(metadata)]}"]
    return [
        f"{name}: __metadata__ {echo(key)} is not a string but {_JSON_KINDS[type(value)]}"
        for key, value in metadata.items()
        if type(value) is not str
    ]


def _parse_entry(shard: ShardMeta, tname: str, entry: object) -> tuple[TensorMeta | None, str | None]:
    problem = _entry_problem(entry)
    if problem:
        return None, f"{echo_name(shard.path.name)}: tensor {echo(tname, NAME_LIMIT)}: {problem}"
    shape, (begin, end) = entry["shape"], entry["data_offsets"]
    return TensorMeta(tname, entry["dtype"], tuple(shape), shard.path, (begin, end), shard.data_start, shard.checked), None


def _entry_problem(entry: object) -> str | None:
    """What is wrong with one header entry, or None (`type(x) is int` also refuses JSON's true and false)."""
    if type(entry) is not dict:
        return "entry is not an object"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if type(dtype) is not str:
        return f"dtype is {echo(dtype, NAME_LIMIT)}, expected a string"
    if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
        return f"shape is {echo(shape, NAME_LIMIT)}, expected a list of non-negative integers"
    if type(offsets) is not list or len(offsets) != 2 or not all(type(o) is int and o >= 0 for o in offsets):
        return f"data_offsets is {echo(offsets, NAME_LIMIT)}, expected [begin, end] non-negative integers"
    return _shape_overflow(shape)


def _shape_overflow(shape: list[int]) -> str | None:
    """Why `shape`'s element count or one of its strides would not fit in int64, or None.

    The element count alone is not enough: `[0, 2**63-1, 2**63-1]` holds nothing,
    yet its first stride is (2**63-1)**2. Every stride and the count divide the
    product of the dimensions (0 counted as 1), so when that product fits, all
    do: the exact check runs only for the rare shape where it does not.
    """
    bound = 1
    for d in shape:
        if d > INT64_MAX:
            return f"shape has a dimension above 2**63-1 ({echo(shape, NAME_LIMIT)}); torch sizes are int64"
        bound *= d if d > 1 else 1
        if bound > INT64_MAX:
            return _exact_overflow(shape)
    return None


def _exact_overflow(shape: list[int]) -> str | None:
    stride = 1
    for d in reversed(shape):
        if stride > INT64_MAX:
            return f"shape {echo(shape, NAME_LIMIT)} has a stride above 2**63-1; torch strides are int64"
        stride *= max(d, 1)
    count = 1
    for d in shape:
        count *= d
    if count > INT64_MAX:
        return f"shape {echo(shape, NAME_LIMIT)} holds more than 2**63-1 elements; torch sizes are int64"
    return None


_DTYPE_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor to write."""

    name: str
    """State-dict name."""
    shape: tuple[int, ...]
    """Shape."""
    dtype: torch.dtype
    """Stored dtype."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def plan_shards(specs: list[TensorSpec], max_bytes: int) -> list[list[TensorSpec]]:
    """Group specs, in order, into shards of at most `max_bytes` (a larger tensor gets its own shard)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    return [s for s in shards if s]


def header_bytes(specs: Iterable[TensorSpec], metadata: dict[str, str] | None = None) -> bytes:
    """The length-prefixed JSON header, padded with spaces to a multiple of 8."""
    header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for spec in specs:
        header[spec.name] = {
            "dtype": _DTYPE_NAMES[spec.dtype], "shape": list(spec.shape), "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return len(body).to_bytes(8, "little") + body


def write_safetensors(
    path: Path,
    specs: list[TensorSpec],
    chunks: Callable[[TensorSpec], Iterator[torch.Tensor]],
    *,
    metadata: dict[str, str] | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    """Write `specs` to `path`; `chunks(spec)` yields contiguous pieces in `spec.dtype`, in order.

    Raises ValueError naming the tensor when its chunks do not add up to its size.
    """
    with open(path, "wb") as f:
        f.write(header_bytes(specs, metadata))
        for spec in specs:
            written = 0
            for chunk in chunks(spec):
                if chunk.dtype != spec.dtype:
                    raise ValueError(f"tensor {spec.name!r}: chunk dtype {chunk.dtype}, expected {spec.dtype}")
                data = chunk.contiguous().view(torch.uint8).numpy()
                f.write(data.data)
                written += data.nbytes
                if on_bytes is not None:
                    on_bytes(data.nbytes)
            if written != spec.nbytes:
                raise ValueError(f"tensor {spec.name!r} in {path.name}: wrote {written} bytes, expected {spec.nbytes}")


def write_component(
    folder: Path,
    shards: list[list[TensorSpec]],
    chunks: Callable[[TensorSpec], Iterator[torch.Tensor]],
    *,
    stem: str = "model",
) -> Path:
    """Write `shards` as `{stem}-0000i-of-0000n.safetensors` plus `{stem}.safetensors.index.json` into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(folder / file, shard, chunks)
        weight_map.update({spec.name: file for spec in shard})
    total = sum(spec.nbytes for shard in shards for spec in shard)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / f"{stem}.safetensors.index.json").write_text(json.dumps(index))
    return folder


def write_tensors(folder: Path, shards: list[dict[str, torch.Tensor]], *, stem: str = "model") -> Path:
    """`write_component` for tensors already in memory: one dict of name -> tensor per shard."""
    tensors = {name: t for shard in shards for name, t in shard.items()}
    specs = [[TensorSpec(name, tuple(t.shape), t.dtype) for name, t in shard.items()] for shard in shards]
    return write_component(folder, specs, lambda spec: iter([tensors[spec.name].reshape(-1)]), stem=stem)
