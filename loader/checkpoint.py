"""Checkpoint discovery: find the components and shards of a checkpoint and
describe every tensor from the safetensors headers alone.

Accepted layouts: a model folder (`model_index.json` + one folder per
component), a component folder (sharded `*.safetensors` with a
`*.safetensors.index.json`, or one file), or one `.safetensors` file.
Nothing here reads a tensor byte; `validate.validate_checkpoint` checks what
was found, and `discover_checkpoint` raises one CheckpointError listing every
problem.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .dtypes import SAFETENSORS_DTYPES
from .errors import CheckpointError

MAX_HEADER_BYTES = 100 * 1024 * 1024
"""Largest header accepted (safetensors' own limit); a larger length means a corrupt file."""


@dataclass(frozen=True)
class TensorMeta:
    """One tensor as its shard's header describes it."""

    name: str
    """Name in the checkpoint (before any rename)."""
    dtype: str
    """safetensors dtype name, e.g. `BF16`."""
    shape: tuple[int, ...]
    """Shape from the header."""
    file: Path
    """The shard holding it."""
    data_offsets: tuple[int, int]
    """[begin, end) relative to the start of the shard's data area."""
    data_start: int
    """Absolute offset of the shard's data area (8 + header length)."""

    @property
    def nbytes(self) -> int:
        """Bytes on disk (end - begin)."""
        return self.data_offsets[1] - self.data_offsets[0]

    @property
    def offset(self) -> int:
        """Absolute file offset of the first byte."""
        return self.data_start + self.data_offsets[0]

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype (the dtype must be known; validation guarantees it)."""
        return SAFETENSORS_DTYPES[self.dtype]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class ShardMeta:
    """One safetensors file."""

    path: Path
    """The file."""
    size: int
    """File size in bytes."""
    data_start: int
    """8 + header length: where tensor data starts."""
    tensors: list[TensorMeta] = field(default_factory=list)
    """Its tensors in header order."""
    metadata: dict[str, str] = field(default_factory=dict)
    """The header's `__metadata__`."""


@dataclass
class ComponentMeta:
    """One component (e.g. `transformer`): its shards and config."""

    name: str
    """Component name (folder name, or the file stem for a lone file)."""
    path: Path
    """Its folder (or the lone file)."""
    shards: list[ShardMeta] = field(default_factory=list)
    """Shards in name order."""
    index_file: Path | None = None
    """The `*.safetensors.index.json`, when sharded with one."""
    weight_map: dict[str, str] | None = None
    """The index's tensor name -> shard file name."""
    config: dict = field(default_factory=dict)
    """Parsed `config.json` next to the shards ({} when absent)."""
    problems: list[str] = field(default_factory=list)
    """Problems found while reading headers and the index (validation adds more)."""

    @property
    def class_name(self) -> str | None:
        """`_class_name` from config.json, which selects a registered model builder."""
        return self.config.get("_class_name")

    @property
    def tensors(self) -> list[TensorMeta]:
        """Every tensor, shard by shard, in file offset order."""
        return [t for s in self.shards for t in sorted(s.tensors, key=lambda t: t.data_offsets)]

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for s in self.shards for t in s.tensors)

    @property
    def tensor_count(self) -> int:
        return sum(len(s.tensors) for s in self.shards)

    def dtype_bytes(self) -> dict[str, int]:
        """Bytes per safetensors dtype."""
        out: dict[str, int] = {}
        for s in self.shards:
            for t in s.tensors:
                out[t.dtype] = out.get(t.dtype, 0) + t.nbytes
        return dict(sorted(out.items()))

    def summary(self) -> dict:
        """JSON-ready totals (for `inspect`)."""
        return {
            "name": self.name,
            "path": str(self.path),
            "class_name": self.class_name,
            "shards": len(self.shards),
            "tensors": self.tensor_count,
            "bytes": self.total_bytes,
            "largest_shard_bytes": max((s.size for s in self.shards), default=0),
            "dtypes": self.dtype_bytes(),
        }


@dataclass
class CheckpointIndex:
    """What `discover_checkpoint` found."""

    path: Path
    """The path given."""
    layout: str
    """`model` (model_index.json folder), `component` (one folder) or `file`."""
    components: dict[str, ComponentMeta]
    """Components by name, in name order."""

    def component(self, name: str | None = None) -> ComponentMeta:
        """The named component; with no name, the only one (or `transformer` in a model folder)."""
        if name is None:
            if len(self.components) == 1:
                return next(iter(self.components.values()))
            if "transformer" in self.components:
                return self.components["transformer"]
            raise CheckpointError(
                f"{self.path} has {len(self.components)} components; pick one with component=: "
                + ", ".join(self.components)
            )
        try:
            return self.components[name]
        except KeyError:
            raise CheckpointError(
                f"{self.path} has no component {name!r}; known: {', '.join(self.components) or 'none'}"
            ) from None

    def summary(self) -> dict:
        return {
            "path": str(self.path),
            "layout": self.layout,
            "components": [c.summary() for c in self.components.values()],
            "tensors": sum(c.tensor_count for c in self.components.values()),
            "bytes": sum(c.total_bytes for c in self.components.values()),
        }


def read_shard_header(path: Path) -> tuple[ShardMeta | None, list[str]]:
    """Parse one shard's header: (shard, problems). Reads 8 + header-length bytes only."""
    name = path.name
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                return None, [f"{name}: file is {size} bytes, too short for a safetensors header length"]
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                return None, [f"{name}: header length {length} exceeds the {MAX_HEADER_BYTES}-byte limit (corrupt file?)"]
            if 8 + length > size:
                return None, [f"{name}: header length {length} runs past the end of the {size}-byte file (truncated?)"]
            raw = f.read(length)
    except OSError as exc:
        return None, [f"{name}: cannot read: {exc.strerror}"]
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, [f"{name}: header is not valid JSON: {exc}"]
    if not isinstance(header, dict):
        return None, [f"{name}: header is a JSON {type(header).__name__}, expected an object"]
    shard = ShardMeta(path=path, size=size, data_start=8 + length)
    problems = []
    metadata = header.pop("__metadata__", {})
    if isinstance(metadata, dict):
        shard.metadata = {str(k): str(v) for k, v in metadata.items()}
    else:
        problems.append(f"{name}: __metadata__ is a {type(metadata).__name__}, expected an object")
    for tname, entry in header.items():
        meta, problem = _parse_entry(shard, tname, entry)
        if problem:
            problems.append(problem)
        else:
            shard.tensors.append(meta)
    return shard, problems


def _parse_entry(shard: ShardMeta, tname: str, entry: object) -> tuple[TensorMeta | None, str | None]:
    where = f"{shard.path.name}: tensor {tname!r}"
    if not isinstance(entry, dict):
        return None, f"{where}: entry is not an object"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        return None, f"{where}: dtype is {dtype!r}, expected a string"
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return None, f"{where}: shape is {shape!r}, expected a list of non-negative integers"
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
    ):
        return None, f"{where}: data_offsets is {offsets!r}, expected [begin, end] non-negative integers"
    return TensorMeta(tname, dtype, tuple(shape), shard.path, (offsets[0], offsets[1]), shard.data_start), None


def _read_json(path: Path, problems: list[str]) -> object | None:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        problems.append(f"{path.name}: cannot read: {exc.strerror}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{path.name}: not valid JSON: {exc}")
    return None


def _discover_component(name: str, folder: Path) -> ComponentMeta:
    component = ComponentMeta(name=name, path=folder)
    config_path = folder / "config.json"
    if config_path.is_file():
        config = _read_json(config_path, component.problems)
        component.config = config if isinstance(config, dict) else {}
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        component.problems.append(
            f"{folder}: several index files ({', '.join(p.name for p in indexes)}); keep one"
        )
        return component
    if indexes:
        component.index_file = indexes[0]
        index = _read_json(indexes[0], component.problems)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if index is not None and not (
            isinstance(weight_map, dict) and all(isinstance(v, str) for v in weight_map.values())
        ):
            component.problems.append(f"{indexes[0].name}: expected an object with a weight_map of name -> file")
            return component
        if weight_map is None:
            return component
        component.weight_map = dict(weight_map)
        files = sorted(set(weight_map.values()))
        for file in files:
            if not (folder / file).is_file():
                tensors = sorted(k for k, v in weight_map.items() if v == file)
                component.problems.append(
                    f"{indexes[0].name} maps {tensors[0]!r}"
                    + (f" (and {len(tensors) - 1} more)" if len(tensors) > 1 else "")
                    + f" to {file!r}, which is not in {folder}"
                )
        shard_paths = [folder / f for f in files if (folder / f).is_file()]
    else:
        shard_paths = sorted(folder.glob("*.safetensors"))
        if not shard_paths:
            component.problems.append(f"{folder}: no *.safetensors files")
    for path in shard_paths:
        shard, problems = read_shard_header(path)
        component.problems.extend(problems)
        if shard is not None:
            component.shards.append(shard)
    return component


def discover_checkpoint(path: str | os.PathLike, *, validate: bool = True) -> CheckpointIndex:
    """Describe the checkpoint at `path` from headers only.

    With `validate` (the default) every problem found by reading and by
    `validate_checkpoint` is raised as one CheckpointError.
    """
    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"{root}: no such file or directory")
    if root.is_file():
        if not root.name.endswith(".safetensors"):
            raise CheckpointError(f"{root}: expected a .safetensors file, a component folder or a model folder")
        component = ComponentMeta(name=root.name.removesuffix(".safetensors"), path=root)
        shard, problems = read_shard_header(root)
        component.problems.extend(problems)
        if shard is not None:
            component.shards.append(shard)
        index = CheckpointIndex(root, "file", {component.name: component})
    elif (root / "model_index.json").is_file():
        problems: list[str] = []
        model_index = _read_json(root / "model_index.json", problems)
        if problems:
            raise CheckpointError(problems)
        if not isinstance(model_index, dict):
            raise CheckpointError(f"{root / 'model_index.json'}: expected a JSON object")
        components = {}
        for name in sorted(model_index):
            folder = root / name
            if name.startswith("_") or not folder.is_dir():
                continue
            if any(folder.glob("*.safetensors")) or any(folder.glob("*.safetensors.index.json")):
                components[name] = _discover_component(name, folder)
        if not components:
            raise CheckpointError(f"{root}: model_index.json lists no component folder with *.safetensors files")
        index = CheckpointIndex(root, "model", components)
    else:
        index = CheckpointIndex(root, "component", {root.name: _discover_component(root.name, root)})
    if validate:
        from .validate import validate_checkpoint

        problems = validate_checkpoint(index)
        if problems:
            raise CheckpointError(problems)
    return index
