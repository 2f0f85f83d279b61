"""What a checkpoint is, as its headers describe it: tensors, shards, components, the whole index.

Plain dataclasses that discovery (`checkpoint`) fills and validation (`validate`)
and every placement read; they open no file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from .confined import CheckedFile
from .dtypes import SAFETENSORS_DTYPES
from core.echo import echo, echo_name
from core.hub_cache import model_label
from core.errors import SHOWN_PROBLEMS, CheckpointError


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
    checked: CheckedFile | None = field(default=None, compare=False, repr=False)
    """The shard as discovery opened and validated it: what a load reopens (`open_shard`)."""

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
    checked: CheckedFile | None = None
    """The file as opened and validated (None only for a hand-built shard)."""
    refused_entries: int = 0
    """Header entries too malformed to describe a tensor (not in `tensors`): with any, whether the
    tensors cover the data area exactly is not judged (their bytes are unaccounted for)."""
    dtype_totals: dict[str, tuple[int, int]] = field(default_factory=dict)
    """(bytes, elements) per safetensors dtype, when read as a summary (`read_shard_header(entries=False)`),
    where `tensors` stays empty."""


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
    library: str | None = None
    """Library the model index names for it (`diffusers`, `transformers`), when it has one."""
    declared_class: str | None = None
    """Class the model index names for it, when it has one."""

    @property
    def class_name(self) -> str | None:
        """The model index's class, else config.json's `_class_name` (diffusers) or first
        `architectures` entry (transformers); it selects a registered model builder."""
        if self.declared_class:
            return self.declared_class
        if isinstance(self.config.get("_class_name"), str):
            return self.config["_class_name"]
        architectures = self.config.get("architectures")
        if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
            return architectures[0]
        return None

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
            "library": self.library,
            "shards": len(self.shards),
            "tensors": self.tensor_count,
            "bytes": self.total_bytes,
            "largest_shard_bytes": max((s.size for s in self.shards), default=0),
            "dtypes": self.dtype_bytes(),
        }


@dataclass(frozen=True)
class AuxFolder:
    """A model-index entry without weights (tokenizer, processor, scheduler, ...): listed, never loaded."""

    name: str
    """Entry name in the model index."""
    path: Path
    """Its folder."""
    library: str | None
    """Library the index names (`transformers`, `diffusers`), if any."""
    class_name: str | None
    """Class the index names, if any."""
    files: tuple[str, ...]
    """File names in the folder (not read)."""

    def summary(self) -> dict:
        return {"name": self.name, "path": str(self.path), "library": self.library,
                "class_name": self.class_name, "files": list(self.files)}


@dataclass
class CheckpointIndex:
    """What `discover_checkpoint` found."""

    path: Path
    """The path given."""
    layout: str
    """`model` (a model-index folder), `component` (one folder) or `file`."""
    components: dict[str, ComponentMeta]
    """Weight components by name, in name order."""
    index_file: Path | None = None
    """`modular_model_index.json` or `model_index.json` of a model folder."""
    pipeline_class: str | None = None
    """The model index's `_class_name` (e.g. `MiniMaxH3ModularPipeline`)."""
    aux: dict[str, AuxFolder] = field(default_factory=dict)
    """Entries with a folder but no weights (tokenizer, processor, schedulers), by name."""
    absent: list[str] = field(default_factory=list)
    """Model-index entries with no folder here."""

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
                f"{echo_name(self.path)} has no component {echo(name)}; "
                f"known: {', '.join(map(echo_name, list(self.components)[:SHOWN_PROBLEMS])) or 'none'}"
            ) from None

    def summary(self) -> dict:
        return {
            "path": str(self.path),
            "name": model_label(self.path),
            "layout": self.layout,
            "index_file": self.index_file.name if self.index_file else None,
            "pipeline_class": self.pipeline_class,
            "components": [c.summary() for c in self.components.values()],
            "non_weight": [a.summary() for a in self.aux.values()],
            "absent": list(self.absent),
            "tensors": sum(c.tensor_count for c in self.components.values()),
            "bytes": sum(c.total_bytes for c in self.components.values()),
        }
