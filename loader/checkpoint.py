"""Checkpoint discovery: find the components and shards of a checkpoint and
describe every tensor from the safetensors headers alone.

Accepted layouts:

- a model folder: `modular_model_index.json` (diffusers' modular pipelines,
  entries `[library, class, {"subfolder": ..., "type_hint": ...}]`) or
  `model_index.json` (entries `[library, class]`), one folder per entry.
  Folders with safetensors files are weight components (diffusers'
  `diffusion_pytorch_model*.safetensors`, transformers'
  `model-0000i-of-0000n.safetensors`, each with its index); the others
  (tokenizer, processor, scheduler, ...) are listed as non-weight folders;
- a component folder (sharded `*.safetensors` with a `*.safetensors.index.json`,
  or one or more files);
- one `.safetensors` file.

Every file opened (index files, configs, shards, component folders) must
resolve under a model root first (`roots.ModelRoots`), and every JSON is
parsed with bounds (`jsonfile`). Nothing here reads a tensor byte;
`validate.validate_checkpoint` checks what was found, and
`discover_checkpoint` raises one CheckpointError listing every problem.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .dtypes import SAFETENSORS_DTYPES
from .confined import CheckedFile, check_name, open_checked, read_at_most, read_json_checked
from .errors import CheckpointError, clip
from .jsonfile import JSONProblem, parse_json
from .roots import ModelRoots, RootEscape, RootsArg

MAX_HEADER_BYTES = 100 * 1024 * 1024
"""Largest header accepted (safetensors' own limit); a larger length means a corrupt file."""
MAX_CHECKPOINT_HEADER_BYTES = 64 * 1024 * 1024
"""Most header bytes read for one whole checkpoint (the H3 DiT's 639 tensors take about 100 KB)."""
INT64_MAX = 2**63 - 1
"""No element count or stride may pass it: torch sizes and strides are int64."""


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
                f"{self.path} has no component {name!r}; known: {', '.join(self.components) or 'none'}"
            ) from None

    def summary(self) -> dict:
        return {
            "path": str(self.path),
            "layout": self.layout,
            "index_file": self.index_file.name if self.index_file else None,
            "pipeline_class": self.pipeline_class,
            "components": [c.summary() for c in self.components.values()],
            "non_weight": [a.summary() for a in self.aux.values()],
            "absent": list(self.absent),
            "tensors": sum(c.tensor_count for c in self.components.values()),
            "bytes": sum(c.total_bytes for c in self.components.values()),
        }


MODEL_INDEX_FILES = ("modular_model_index.json", "model_index.json")
"""Model-index file names, in the order diffusers looks for them."""


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
    path: Path, roots: ModelRoots | None = None, budget: HeaderBudget | None = None
) -> tuple[ShardMeta | None, list[str]]:
    """Parse one shard's header: (shard, problems). Reads 8 + header-length bytes only, from one
    descriptor opened confined to `roots` (default: the shard's own folder), which is what a load
    reopens and checks (`ShardMeta.checked`).

    Messages name the file and what was wrong, never the bytes read (a file
    that is not safetensors must not leak its start as a "length").
    """
    name = clip(path.name)
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
        header = parse_json(raw)
    except JSONProblem as exc:
        return None, [f"{name}: header is {exc}"]
    if not isinstance(header, dict):
        return None, [f"{name}: header is a JSON {type(header).__name__}, expected an object"]
    shard = ShardMeta(path=path, size=size, data_start=8 + length, checked=checked)
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
    problem = _entry_problem(entry)
    if problem:
        return None, f"{clip(shard.path.name)}: tensor {clip(repr(tname))}: {problem}"
    shape, (begin, end) = entry["shape"], entry["data_offsets"]
    return TensorMeta(tname, entry["dtype"], tuple(shape), shard.path, (begin, end), shard.data_start, shard.checked), None


def _entry_problem(entry: object) -> str | None:
    """What is wrong with one header entry, or None (`type(x) is int` also refuses JSON's true and false)."""
    if type(entry) is not dict:
        return "entry is not an object"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if type(dtype) is not str:
        return f"dtype is {clip(repr(dtype))}, expected a string"
    if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
        return f"shape is {clip(repr(shape))}, expected a list of non-negative integers"
    if type(offsets) is not list or len(offsets) != 2 or not all(type(o) is int and o >= 0 for o in offsets):
        return f"data_offsets is {clip(repr(offsets))}, expected [begin, end] non-negative integers"
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
            return f"shape has a dimension above 2**63-1 ({clip(repr(shape))}); torch sizes are int64"
        bound *= d if d > 1 else 1
        if bound > INT64_MAX:
            return _exact_overflow(shape)
    return None


def _exact_overflow(shape: list[int]) -> str | None:
    stride = 1
    for d in reversed(shape):
        if stride > INT64_MAX:
            return f"shape {clip(repr(shape))} has a stride above 2**63-1; torch strides are int64"
        stride *= max(d, 1)
    count = 1
    for d in shape:
        count *= d
    if count > INT64_MAX:
        return f"shape {clip(repr(shape))} holds more than 2**63-1 elements; torch sizes are int64"
    return None


def _read_json(path: Path, roots: ModelRoots, entry: str, problems: list[str]) -> object | None:
    """The parsed file (opened confined to `roots`), or None with a problem naming it (never its contents)."""
    try:
        return read_json_checked(path, roots, entry)
    except RootEscape:
        raise
    except CheckpointError as exc:
        problems.extend(exc.messages())
    except OSError as exc:
        problems.append(f"{entry}: cannot read: {exc.strerror}")
    return None


def _listing(folder: Path, pattern: str, name: str) -> list[Path]:
    """`folder`'s entries matching `pattern`, sorted; a folder that cannot be listed is one CheckpointError."""
    try:
        if not os.access(folder, os.R_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
        return sorted(folder.glob(pattern))
    except OSError as exc:
        raise CheckpointError(f"{name}: cannot list the folder {folder}: {exc.strerror}") from None


def _has_weights(folder: Path, name: str) -> bool:
    return bool(_listing(folder, "*.safetensors", name) or _listing(folder, "*.safetensors.index.json", name))


def _discover_component(name: str, folder: Path, roots: ModelRoots, budget: HeaderBudget) -> ComponentMeta:
    """Config, index and shard headers of one folder; every file opened confined to `roots`."""
    roots.check(folder, f"component {name!r} folder {folder}")
    component = ComponentMeta(name=name, path=folder)
    indexes = _listing(folder, "*.safetensors.index.json", f"component {name!r}")
    config_path = folder / "config.json"
    if os.path.lexists(config_path):
        config = _read_json(config_path, roots, f"{name}/config.json", component.problems)
        component.config = config if isinstance(config, dict) else {}
    if len(indexes) > 1:
        component.problems.append(
            f"{folder}: several index files ({', '.join(clip(p.name) for p in indexes[:5])}"
            f"{', ...' if len(indexes) > 5 else ''}); keep one"
        )
        return component
    if indexes:
        shard_paths = _index_shards(component, indexes[0], roots)
    else:
        shard_paths = [roots.check(p, f"{name}/{clip(p.name)}") for p in _listing(folder, "*.safetensors", name)]
        if not shard_paths:
            component.problems.append(f"{folder}: no *.safetensors files")
    for path in shard_paths:
        shard, problems = read_shard_header(path, roots, budget)
        component.problems.extend(problems)
        if shard is not None:
            component.shards.append(shard)
    return component


def _index_shards(component: ComponentMeta, index_path: Path, roots: ModelRoots) -> list[Path]:
    """Read the index's weight_map into `component`; the shard files it names (checked against `roots`).

    Linear in the index's entries: tensors are grouped by file once, not searched per file.
    """
    folder = component.path
    component.index_file = index_path
    index = _read_json(index_path, roots, f"{component.name}/{clip(index_path.name)}", component.problems)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if index is not None and not (
        isinstance(weight_map, dict) and all(isinstance(v, str) for v in weight_map.values())
    ):
        component.problems.append(f"{index_path.name}: expected an object with a weight_map of name -> file")
        return []
    if weight_map is None:
        return []
    component.weight_map = dict(weight_map)
    by_file: dict[str, list[str]] = {}
    for tensor, file in weight_map.items():
        by_file.setdefault(file, []).append(tensor)
    shard_paths, problems = [], []
    for file in sorted(by_file):
        tensors = by_file[file]
        named = f"{clip(repr(min(tensors)))}" + (f" (and {len(tensors) - 1} more)" if len(tensors) > 1 else "")
        where = f"{component.name}/{index_path.name} maps {named} to {clip(repr(file))}"
        try:
            check_name(file, where)
            path = roots.check(folder / file, f"{where}, which")
            present = os.path.lexists(path)
        except RootEscape:
            raise
        except CheckpointError as exc:
            problems.extend(exc.messages())
            continue
        except (OSError, ValueError) as exc:
            problems.append(f"{where}, which cannot be looked up: {exc}")
            continue
        if present:
            shard_paths.append(path)
        else:
            problems.append(f"{index_path.name} maps {named} to {clip(repr(file))}, which is not in {folder}")
    component.problems.extend(problems)
    return shard_paths


def _index_entry(name: str, value: object) -> tuple[str, str | None, str | None] | None:
    """(subfolder, library, class) of one model-index entry, or None for a config value.

    `model_index.json` entries are `[library, class]`; `modular_model_index.json`
    entries are `[library, class, spec]` where `spec` may name a `subfolder` and a
    `type_hint` `[library, class]` (used when the first two are null).
    """
    if not isinstance(value, list) or len(value) not in (2, 3):
        return None
    library, class_name = (v if isinstance(v, str) else None for v in value[:2])
    subfolder = name
    if len(value) == 3:
        spec = value[2]
        if not isinstance(spec, dict):
            return None
        hint = spec.get("type_hint")
        if (library is None or class_name is None) and isinstance(hint, list) and len(hint) == 2:
            library = library or (hint[0] if isinstance(hint[0], str) else None)
            class_name = class_name or (hint[1] if isinstance(hint[1], str) else None)
        if isinstance(spec.get("subfolder"), str) and spec["subfolder"]:
            subfolder = spec["subfolder"]
    return subfolder, library, class_name


def _discover_model(root: Path, index_path: Path, roots: ModelRoots, budget: HeaderBudget) -> CheckpointIndex:
    """A model folder: every entry of its model index, as a weight component or a non-weight folder."""
    problems: list[str] = []
    model_index = _read_json(index_path, roots, index_path.name, problems)
    if problems:
        raise CheckpointError(problems)
    if not isinstance(model_index, dict):
        raise CheckpointError(f"{index_path}: expected a JSON object")
    pipeline_class = model_index.get("_class_name")
    index = CheckpointIndex(
        root, "model", {}, index_file=index_path,
        pipeline_class=pipeline_class if isinstance(pipeline_class, str) else None,
    )
    for name in sorted(model_index):
        entry = _index_entry(name, model_index[name]) if not name.startswith("_") else None
        if entry is None:
            continue
        subfolder, library, class_name = entry
        where = f"{index_path.name} entry {clip(repr(name))}" + (
            f" (subfolder {clip(repr(subfolder))})" if subfolder != name else "")
        check_name(name, where)
        check_name(subfolder, where)
        folder = roots.check(root / subfolder, where)
        if not folder.is_dir():
            index.absent.append(name)
        elif _has_weights(folder, where):
            component = _discover_component(name, folder, roots, budget)
            component.library, component.declared_class = library, class_name
            index.components[name] = component
        else:
            files = tuple(p.name for p in _listing(folder, "*", where))
            index.aux[name] = AuxFolder(name, folder, library, class_name, files)
    if not index.components:
        raise CheckpointError(f"{root}: {index_path.name} lists no component folder with *.safetensors files")
    return index


def discover_checkpoint(
    path: str | os.PathLike, *, validate: bool = True, roots: RootsArg = None
) -> CheckpointIndex:
    """Describe the checkpoint at `path` from headers only.

    `roots`: folders every file opened must resolve under, links resolved
    (default: the checkpoint's own root, i.e. `path` itself, or a lone file's
    folder); an escape raises CheckpointError naming the entry whatever
    `validate` says. With `validate` (the default) every problem found by
    reading and by `validate_checkpoint` is raised as one CheckpointError.
    """
    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"{root}: no such file or directory")
    confined = ModelRoots.for_checkpoint(root, roots)
    confined.check(root, str(root))
    budget = HeaderBudget()
    if not root.is_dir():
        if not root.name.endswith(".safetensors"):
            raise CheckpointError(f"{root}: expected a .safetensors file, a component folder or a model folder")
        component = ComponentMeta(name=root.name.removesuffix(".safetensors"), path=root)
        shard, problems = read_shard_header(root, confined, budget)
        component.problems.extend(problems)
        if shard is not None:
            component.shards.append(shard)
        index = CheckpointIndex(root, "file", {component.name: component})
    else:
        _listing(root, "*", str(root))  # an unreadable folder is one line, not a traceback further down
        index_path = next((root / n for n in MODEL_INDEX_FILES if os.path.lexists(root / n)), None)
        if index_path is not None:
            index = _discover_model(root, index_path, confined, budget)
        else:
            component = _discover_component(root.name, root, confined, budget)
            index = CheckpointIndex(root, "component", {root.name: component})
    if validate:
        from .validate import validate_checkpoint

        problems = validate_checkpoint(index)
        if problems:
            raise CheckpointError(problems)
    return index
