"""Write safetensors files and sharded component folders without holding them in memory.

The header (names, dtypes, shapes, offsets) is computed from specs alone and
written first; then each tensor's bytes come from a generator of chunks, one
tensor at a time, so memory stays at one chunk whatever the file size.
`write_component` adds the shard naming and index.json of a diffusers
component folder; `write_tensors` does the same for tensors already in memory
(test and benchmark checkpoints).
"""

from __future__ import annotations

import hashlib
import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from loader.dtypes import SAFETENSORS_DTYPES

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


CHUNK_ELEMENTS = 1 << 24
"""Elements generated per chunk of a large random tensor (64 MiB in fp32)."""


def chunk_generator(seed: int, name: str, chunk: int) -> torch.Generator:
    """The generator of one chunk of one tensor: the bytes depend on (seed, name, chunk) only, not on threads."""
    digest = hashlib.sha256(f"{seed}:{name}:{chunk}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def random_chunks(pool: ThreadPoolExecutor, spec: TensorSpec, seed: int, bound: float,
                  ahead: int) -> Iterator[torch.Tensor]:
    """Uniform values in [-bound, bound] as chunks in `spec.dtype`, generated `ahead` chunks ahead on `pool`
    (one more than its workers keeps every worker busy)."""
    starts = list(range(0, spec.numel, CHUNK_ELEMENTS))

    def make(i: int) -> torch.Tensor:
        n = min(CHUNK_ELEMENTS, spec.numel - starts[i])
        return torch.empty(n).uniform_(-bound, bound, generator=chunk_generator(seed, spec.name, i)).to(spec.dtype)

    futures = [pool.submit(make, i) for i in range(min(ahead, len(starts)))]
    for i in range(len(starts)):
        chunk = futures[i].result()
        futures[i] = None
        if i + ahead < len(starts):
            futures.append(pool.submit(make, i + ahead))
        yield chunk


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
