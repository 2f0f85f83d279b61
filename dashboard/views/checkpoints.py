"""The checkpoints the Run page offers: found under the model roots and checked by the loader.

Headers only (nothing is read or mapped). Every candidate goes through the
loader's own discovery and validation, so a truncated shard is shown with the
message a job would have failed with, before anything is queued. One bad folder
never takes the listing down: it is listed as broken, with its message.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dashboard import format as fmt
from dashboard.views import failure
from core.errors import DrainboardError
from core.hub_cache import holding_root, model_label
from loader.catalog import candidates
from loader.checkpoint import checkpoint_identity, checkpoint_problems
from loader.roots import ModelRoots

LABEL_PROBLEM = 120
"""Characters of a broken checkpoint's first problem its picker entry shows (the page shows them all)."""


@dataclass(frozen=True)
class Component:
    """One component of a checkpoint as the picker shows it."""

    name: str
    """Folder name (`transformer`, `vae`, ...) or the file's stem."""
    bytes: int
    """Sum of its tensors' bytes in checkpoint dtype."""
    tensors: int
    """Tensors in its headers."""
    shards: int
    """Safetensors files it spans."""


@dataclass(frozen=True)
class CheckpointChoice:
    """A checkpoint found under a model root."""

    path: Path
    """Folder (or file) to pass as the job's model."""
    root: Path
    """The model root it was found under."""
    layout: str
    """model, component or file (as loader.checkpoint says); unknown when discovery failed."""
    components: tuple[Component, ...]
    """Components with their sizes; empty when discovery failed."""
    problems: tuple[str, ...] = ()
    """The loader's messages when it cannot be used (discovery or validation); empty when sound."""
    default_component: str | None = None
    """What a load job loads when no component is named (the loader's own choice); None when it needs one."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def total_bytes(self) -> int:
        return sum(c.bytes for c in self.components)

    @property
    def name(self) -> str:
        """`MiniMaxAI/MiniMax-H3 @ main` for a Hugging Face cache snapshot, else the folder's or file's name."""
        label = model_label(self.path)
        return self.path.name if label == str(self.path) else label

    @property
    def label(self) -> str:
        """`demo — 0.2 GiB, 4 components (under /data/models)`, or `✗ bad — broken: …`."""
        if self.problems:
            more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
            first = self.problems[0]
            if len(first) > LABEL_PROBLEM:  # cut at a word, never mid-quote
                first = first[:LABEL_PROBLEM].rsplit(" ", 1)[0] + "…"
            return f"✗ {self.name} — broken: {first}{more}"
        parts = f", {len(self.components)} components" if len(self.components) > 1 else ""
        return f"{self.name} — {fmt.gib(self.total_bytes)}{parts} (under {self.root})"

    def bytes_to_place(self, kind: str, component: str | None) -> int:
        """What a job will place in checkpoint dtype: the chosen component, every component
        for a generate job, else the loader's default component of a load."""
        sizes = {c.name: c.bytes for c in self.components}
        if kind == "generate" and not component:
            return sum(sizes.values())
        return sizes.get(component or self.default_component or "", sum(sizes.values()))


def outside_roots(wanted: str, roots: list) -> str:
    """Why a path the form was given is not offered, and how to offer it: the setting and the file."""
    listed = ", ".join(str(r) for r in roots)
    if not Path(wanted).exists():
        return (f"{wanted} does not exist. To use a checkpoint elsewhere, add its folder to the model roots: "
                "DRAINBOARD_MODEL_ROOTS (folders separated by ':') or `model_roots` in drainboard.toml, then restart.")
    holder = holding_root(Path(wanted).resolve())
    return (f"{wanted} is not under a model root ({listed}). A root holding it: {holder}; add it to "
            "DRAINBOARD_MODEL_ROOTS (folders separated by ':') or `model_roots` in drainboard.toml, then restart.")


def _failure(exc: BaseException) -> list[str]:
    """The messages of whatever discovery raised, in words (a crafted file must not crash the page),
    near-identical lines folded (a truncated shard's every tensor is one line)."""
    if isinstance(exc, DrainboardError):
        return failure.fold([failure.plain(m) for m in exc.messages()])
    if isinstance(exc, RecursionError):
        return ["a JSON file is nested too deeply to parse"]
    return [f"cannot be read: {failure.plain(str(exc))}"]


def describe_checkpoint(path: Path, root: Path, roots: list[Path]) -> CheckpointChoice:
    """Components and sizes from headers, then the loader's validation, every file confined to
    the model roots as a job's would be; a checkpoint that fails either is listed with every message.

    Remembered by the files' identity (`loader.checkpoint.checkpoint_identity`): every widget change reruns
    the Run page, and a rerun must cost a few `stat`s, not a parse of every header.
    """
    identity = checkpoint_identity(path)
    if identity is None:
        return _describe(path, root, roots)
    return _described(path, root, tuple(roots), identity)


@functools.lru_cache(maxsize=256)
def _described(path: Path, root: Path, roots: tuple[Path, ...], identity: tuple) -> CheckpointChoice:
    """`_describe`, one entry per checkpoint state (`identity` is only the key)."""
    return _describe(path, root, list(roots))


def _describe(path: Path, root: Path, roots: list[Path]) -> CheckpointChoice:
    try:
        index, problems = checkpoint_problems(path, roots)  # the check `jobs submit` runs too
    except Exception as exc:  # one bad folder is a broken entry, never a broken page
        return CheckpointChoice(path, root, "unknown", (), problems=tuple(_failure(exc)))
    if index is None:
        return CheckpointChoice(path, root, "unknown", (), problems=tuple(problems))
    components = tuple(
        Component(c.name, c.total_bytes, c.tensor_count, len(c.shards)) for c in index.components.values()
    )
    try:
        default = index.component(None).name
    except DrainboardError:
        default = None
    problems = failure.fold([failure.plain(p) for p in problems])
    return CheckpointChoice(path, root, index.layout, components, problems=tuple(problems), default_component=default)


def find_checkpoints(roots: list[Path]) -> list[CheckpointChoice]:
    """Every checkpoint under the model roots (the loader's `catalog.candidates`), in root order then name order."""
    confined = ModelRoots(roots)
    return [describe_checkpoint(path, root, roots) for root in roots for path in candidates(root, confined)]


def components_table(choice: CheckpointChoice) -> pd.DataFrame:
    return pd.DataFrame(
        [{"component": c.name, "size": fmt.gib(c.bytes, 2), "tensors": c.tensors, "shards": c.shards} for c in choice.components],
        columns=["component", "size", "tensors", "shards"],
    )
