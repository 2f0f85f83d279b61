"""Every checkpoint under some folders and the Hugging Face cache, described from headers alone.

What `python -m loader models` prints and the dashboard's Models page shows: each checkpoint's layout
(diffusers folder, hub snapshot, single file, GGUF file, component folder, unknown), each component's
bytes and dtypes (a GGUF file's quant types, from its header), and whether its weights fit this machine. Found at most two levels under a folder (a cache's
repositories: each snapshot); each goes through the loader's own discovery, confined to the roots, but
reads only what the listing shows: index files and each shard's header summed per dtype, with no
per-tensor description and no validation (`discover_checkpoint(entries=False)`). So the listing stays fast
with many checkpoints (bench/bench_models_listing.py); what it calls sound may still be refused by the
full check a submit runs (`checkpoint_problems`), which names every problem.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from core.errors import DrainboardError, first_of
from core.hub_cache import SNAPSHOTS, model_label, repo_id_of, snapshot_of
from .checkpoint import MODEL_INDEX_FILES, discover_checkpoint
from .gguf_header import UNQUANTIZED, is_gguf, read_gguf_header
from .roots import ModelRoots

RUN_ELEMENT_BYTES = 2
"""A generate holds floating weights at bfloat16: the verdict counts them so."""
LAYOUTS = {"model": "diffusers folder", "component": "component folder", "file": "single file"}
GGUF_LAYOUT = "GGUF file"
"""A lone `.gguf` file: a quantized DiT, its bytes and quant types from its header (`gguf_header`)."""
"""The loader's layout names as a user reads them (a diffusers folder in the cache is a `hub snapshot`)."""


@dataclass(frozen=True)
class ComponentEntry:
    """One component of a listed checkpoint."""

    name: str
    bytes: int
    """On disk, in the checkpoint's dtypes."""
    run_bytes: int
    """Held at run time: floating tensors at bfloat16, the rest as stored."""
    dtypes: dict[str, int]
    """Bytes per safetensors dtype (per GGML quant type for a GGUF file: `Q8_0`, `F32`)."""


@dataclass(frozen=True)
class ModelEntry:
    """One checkpoint found."""

    path: Path
    name: str
    """`MiniMaxAI/MiniMax-H3 @ main` for a hub snapshot, else the folder's or file's name."""
    layout: str
    """`diffusers folder`, `hub snapshot`, `single file`, `GGUF file`, `component folder` or `unknown`."""
    components: tuple[ComponentEntry, ...] = ()
    problems: tuple[str, ...] = ()
    """Why its headers could not be read (discovery's messages, bounded); not the full check's."""
    verdict: str = ""
    """`fits`, `needs sequential residency` or `does not fit: <component>` (weights only; empty when broken)."""

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.components)

    def to_dict(self) -> dict:
        return {**asdict(self), "path": str(self.path), "bytes": self.bytes}


@dataclass(frozen=True)
class Memory:
    """What the verdict weighs weights against."""

    bytes: int
    where: str
    """`cuda:0 (H200)`, `host MemAvailable`: said beside the verdict."""


def fit_verdict(run_bytes: dict[str, int], memory: int) -> str:
    """`fits` when every component's weights fit at once, `needs sequential residency` when the largest alone
    does (one component at a time, as `--sequential-components` runs), else `does not fit: <largest>`."""
    if not run_bytes:
        return ""
    largest = max(run_bytes, key=run_bytes.get)
    if sum(run_bytes.values()) <= memory:
        return "fits"
    return "needs sequential residency" if run_bytes[largest] <= memory else f"does not fit: {largest}"


def machine_memory() -> Memory:
    """This machine's memory for the weights: a discrete CUDA device's total, else the host's MemAvailable."""
    from machine.device import probe_device
    from machine.memory import sample_memory

    cuda = probe_device("cuda:0")
    if cuda.source != "probe-failed" and not cuda.unified_memory and cuda.total_memory:
        return Memory(cuda.total_memory, f"cuda:0 ({cuda.name})")
    return Memory(sample_memory().mem_available, "host MemAvailable")


def _looks_like_checkpoint(folder: Path) -> bool:
    return any((folder / n).is_file() for n in MODEL_INDEX_FILES) or any(folder.glob("*.safetensors")) \
        or any(folder.glob("*.safetensors.index.json"))


def _children(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    except OSError:
        return []


def candidates(root: Path, roots: ModelRoots, *, gguf: bool = False) -> list[Path]:
    """Model folders, component folders and lone `.safetensors` files (and `.gguf` ones with `gguf`: a GGUF DiT is
    no checkpoint a load job takes) at most two levels under `root`, and each snapshot of a cache repository
    there, that resolve under `roots`."""
    found: list[Path] = []
    for entry in _children(root):
        if not roots.contains(entry):
            continue
        if repo_id_of(entry.name) is not None and entry.is_dir():
            found.extend(s for s in _children(entry / SNAPSHOTS) if s.is_dir() and _looks_like_checkpoint(s))
        elif entry.is_file() and (entry.name.endswith(".safetensors") or (gguf and is_gguf(entry))):
            found.append(entry)
        elif entry.is_dir() and _looks_like_checkpoint(entry):
            found.append(entry)
        elif entry.is_dir():
            found.extend(sub for sub in _children(entry)
                         if sub.is_dir() and roots.contains(sub) and _looks_like_checkpoint(sub))
    return found


def describe(path: Path, roots: Iterable[str | os.PathLike], memory: int) -> ModelEntry:
    """One checkpoint from its headers, confined to `roots`; a broken one is listed with the loader's messages."""
    label = model_label(path)
    name = path.name if label == str(path) else label
    if is_gguf(path):
        return _gguf_entry(path, name, roots, memory)
    try:
        index = discover_checkpoint(path, validate=False, roots=list(roots), entries=False)
    except DrainboardError as exc:
        return ModelEntry(path, name, "unknown", problems=tuple(first_of(exc.messages())))
    except (OSError, RecursionError) as exc:
        return ModelEntry(path, name, "unknown", problems=(str(exc),))
    layout = "hub snapshot" if index.layout == "model" and snapshot_of(path) else LAYOUTS[index.layout]
    components = tuple(_component_entry(c) for c in index.components.values())
    problems = first_of(sorted(p for c in index.components.values() for p in c.problems))
    verdict = "" if problems else fit_verdict({c.name: c.run_bytes for c in components}, memory)
    return ModelEntry(path, name, layout, components, tuple(problems), verdict)


def _gguf_entry(path: Path, name: str, roots: Iterable[str | os.PathLike], memory: int) -> ModelEntry:
    """A GGUF file as one `transformer` component: bytes per quant type; held quantized as stored, its plain
    F32 and F16 tensors at bfloat16."""
    try:
        header = read_gguf_header(path, ModelRoots(roots))
    except DrainboardError as exc:
        return ModelEntry(path, name, GGUF_LAYOUT, problems=tuple(first_of(exc.messages())))
    run = sum(t.numel * RUN_ELEMENT_BYTES if t.quant_type in UNQUANTIZED else t.nbytes for t in header.tensors)
    types = header.bytes_by_type()
    component = ComponentEntry("transformer", sum(types.values()), run, types)
    return ModelEntry(path, name, GGUF_LAYOUT, (component,), verdict=fit_verdict({"transformer": run}, memory))


def _component_entry(component) -> ComponentEntry:
    """Bytes on disk, bytes held at run time and bytes per dtype, from the shards' per-dtype sums."""
    totals: dict[str, tuple[int, int]] = {}
    for shard in component.shards:
        for dtype, (held, elements) in shard.dtype_totals.items():
            before = totals.get(dtype, (0, 0))
            totals[dtype] = (before[0] + held, before[1] + elements)
    dtypes = {dtype: held for dtype, (held, _) in sorted(totals.items())}
    run = sum(elements * RUN_ELEMENT_BYTES if _floating(dtype) else held for dtype, (held, elements) in totals.items())
    return ComponentEntry(component.name, sum(dtypes.values()), run, dtypes)


def _floating(dtype: str) -> bool:
    return dtype.startswith(("F", "BF")) and not dtype.startswith("F8")


def find_models(folders: Iterable[str | os.PathLike], memory: int) -> list[ModelEntry]:
    """Every checkpoint under `folders` (each one a root), in folder order then name order."""
    roots = ModelRoots(folders)
    return [describe(path, roots.folders, memory) for root in roots.folders
            for path in candidates(root, roots, gguf=True)]
