"""Every checkpoint under some folders and the Hugging Face cache, described from headers alone.

What `python -m loader models` prints and the dashboard's Models page shows: each checkpoint's layout
(diffusers folder, hub snapshot, single file, component folder, unknown), each component's bytes and
dtypes, and whether its weights fit this machine. Found at most two levels under a folder (a cache's
repositories: each snapshot); each goes through the loader's own discovery and validation, so what the
listing calls sound is what a job would load. Nothing reads a tensor's data, so the listing stays fast
with many checkpoints (bench/bench_models_listing.py).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from core.errors import DrainboardError
from core.hub_cache import SNAPSHOTS, model_label, repo_id_of, snapshot_of
from .checkpoint import MODEL_INDEX_FILES, checkpoint_problems
from .roots import ModelRoots

RUN_ELEMENT_BYTES = 2
"""A generate holds floating weights at bfloat16: the verdict counts them so."""
LAYOUTS = {"model": "diffusers folder", "component": "component folder", "file": "single file"}
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
    """Bytes per safetensors dtype."""


@dataclass(frozen=True)
class ModelEntry:
    """One checkpoint found."""

    path: Path
    name: str
    """`MiniMaxAI/MiniMax-H3 @ main` for a hub snapshot, else the folder's or file's name."""
    layout: str
    """`diffusers folder`, `hub snapshot`, `single file`, `component folder` or `unknown`."""
    components: tuple[ComponentEntry, ...] = ()
    problems: tuple[str, ...] = ()
    """The loader's messages when it cannot be loaded."""
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


def candidates(root: Path, roots: ModelRoots) -> list[Path]:
    """Model folders, component folders and lone `.safetensors` files at most two levels under `root`, and
    each snapshot of a cache repository there, that resolve under `roots`."""
    found: list[Path] = []
    for entry in _children(root):
        if not roots.contains(entry):
            continue
        if repo_id_of(entry.name) is not None and entry.is_dir():
            found.extend(s for s in _children(entry / SNAPSHOTS) if s.is_dir() and _looks_like_checkpoint(s))
        elif entry.is_file() and entry.name.endswith(".safetensors"):
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
    try:
        index, problems = checkpoint_problems(path, list(roots))
    except (DrainboardError, OSError, RecursionError) as exc:
        return ModelEntry(path, name, "unknown", problems=(str(exc),))
    if index is None:
        return ModelEntry(path, name, "unknown", problems=tuple(problems))
    layout = "hub snapshot" if index.layout == "model" and snapshot_of(path) else LAYOUTS[index.layout]
    components = tuple(
        ComponentEntry(c.name, c.total_bytes, sum(_run_bytes(t) for t in c.tensors), c.dtype_bytes())
        for c in index.components.values()
    )
    verdict = "" if problems else fit_verdict({c.name: c.run_bytes for c in components}, memory)
    return ModelEntry(path, name, layout, components, tuple(problems), verdict)


def _run_bytes(tensor) -> int:
    floating = tensor.dtype.startswith(("F", "BF")) and not tensor.dtype.startswith("F8")
    return tensor.numel * RUN_ELEMENT_BYTES if floating else tensor.nbytes


def find_models(folders: Iterable[str | os.PathLike], memory: int) -> list[ModelEntry]:
    """Every checkpoint under `folders` (each one a root), in folder order then name order."""
    roots = ModelRoots(folders)
    return [describe(path, roots.folders, memory) for root in roots.folders for path in candidates(root, roots)]
