"""What the Run page offers and predicts, as plain functions.

Checkpoints are found under the configured model roots from safetensors
headers only (nothing is read or mapped); the offload preview is the loader's
own pure policy function, so what the page shows is what the job will do.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from dashboard import format as fmt
from loader.checkpoint import discover_checkpoint
from loader.device import DeviceInfo
from loader.errors import CheckpointError
from loader.offload import OffloadSettings, resolve_offload

MODE_HELP = {
    "stream": "stream: reads tensor by tensor straight into place, never builds a dict; about 1.0×",
    "drain": "drain: builds the dict of mmap views, pops each entry as it is placed; about 1.16×",
    "retain": "retain: keeps every mmap view until the end (the classic loader); about 2.0×",
}
"""One-line explanation per placement mode, shown under the mode control."""

MODE_RATIO = {"stream": 1.0, "drain": 1.16, "retain": 2.0}
"""Typical peak footprint per mode (DESIGN.md's measurements), for the fit forecast."""


@dataclass(frozen=True)
class Component:
    """One component of a checkpoint as the picker shows it."""

    name: str
    bytes: int
    tensors: int
    shards: int


@dataclass(frozen=True)
class CheckpointChoice:
    """A checkpoint found under a model root."""

    path: Path
    """Folder (or file) to pass as the job's model."""
    root: Path
    """The model root it was found under."""
    layout: str
    """model, component or file (as loader.checkpoint says)."""
    components: tuple[Component, ...]
    """Components with their sizes; empty when the headers could not be read."""
    problem: str | None = None
    """Why the checkpoint cannot be used, when it cannot."""

    @property
    def total_bytes(self) -> int:
        return sum(c.bytes for c in self.components)

    @property
    def label(self) -> str:
        """`demo — 0.3 GiB, 4 components (under /data/models)`."""
        if self.problem:
            return f"{self.path.name} — unreadable ({self.root})"
        parts = f", {len(self.components)} components" if len(self.components) > 1 else ""
        return f"{self.path.name} — {fmt.gib(self.total_bytes)}{parts} (under {self.root})"


def _candidates(root: Path) -> list[Path]:
    """Model folders, component folders and lone .safetensors files, at most two levels down."""
    found: list[Path] = []
    if not root.is_dir():
        return found
    for entry in sorted(root.iterdir()):
        if entry.is_file() and entry.name.endswith(".safetensors"):
            found.append(entry)
        elif entry.is_dir() and not entry.name.startswith("."):
            if (entry / "model_index.json").is_file() or any(entry.glob("*.safetensors")):
                found.append(entry)
            else:
                found.extend(
                    sub
                    for sub in sorted(entry.iterdir())
                    if sub.is_dir() and ((sub / "model_index.json").is_file() or any(sub.glob("*.safetensors")))
                )
    return found


def describe_checkpoint(path: Path, root: Path) -> CheckpointChoice:
    """Components and sizes from headers; a broken checkpoint is listed with its problem."""
    try:
        index = discover_checkpoint(path, validate=False)
    except CheckpointError as e:
        return CheckpointChoice(path, root, "unknown", (), problem=str(e).splitlines()[0])
    components = tuple(
        Component(c.name, c.total_bytes, c.tensor_count, len(c.shards)) for c in index.components.values()
    )
    return CheckpointChoice(path, root, index.layout, components)


def find_checkpoints(roots: list[Path]) -> list[CheckpointChoice]:
    """Every checkpoint under the model roots, in root order then name order."""
    return [describe_checkpoint(path, root) for root in roots for path in _candidates(root)]


def components_table(choice: CheckpointChoice) -> pd.DataFrame:
    return pd.DataFrame(
        [{"component": c.name, "size": fmt.gib(c.bytes, 2), "tensors": c.tensors, "shards": c.shards} for c in choice.components],
        columns=["component", "size", "tensors", "shards"],
    )


def offload_preview(settings: OffloadSettings, device: DeviceInfo) -> pd.DataFrame:
    """Every offload flag: as requested, as the job will use it, and why it changed."""
    resolved, decisions = resolve_offload(settings, device)
    why = {d.flag: d.reason for d in decisions}
    return pd.DataFrame(
        [
            {
                "flag": f.name,
                "requested": getattr(settings, f.name),
                "used": getattr(resolved, f.name),
                "why": why.get(f.name, "kept as requested"),
            }
            for f in fields(OffloadSettings)
        ]
    )


@dataclass(frozen=True)
class Forecast:
    """Will the job fit: current use plus the mode's typical peak against the wall."""

    in_use: int
    """MemTotal − MemAvailable now."""
    predicted_peak: int
    """Mode ratio × bytes to place."""
    capacity: int
    """Bytes of the pool (device memory; the host's MemTotal on unified memory and CPU)."""
    share: float
    """(in_use + predicted_peak) / capacity."""
    message: str
    """What to tell the user, with a cheaper mode when this one will not fit."""


def forecast(mode: str, bytes_to_place: int, in_use: int, capacity: int) -> Forecast:
    """Predict the peak of `mode` for a checkpoint of `bytes_to_place` bytes."""
    predicted = int(MODE_RATIO[mode] * bytes_to_place)
    share = (in_use + predicted) / capacity
    headroom = capacity - in_use - predicted
    if share <= 0.8:
        message = f"Fits: {fmt.gib(headroom)} headroom at the predicted peak ({fmt.percent(share)} of {fmt.gib(capacity)})."
    elif share <= 1.0:
        message = f"Tight: {fmt.percent(share)} of {fmt.gib(capacity)} at the predicted peak; only {fmt.gib(headroom)} left."
    else:
        message = f"Will not fit: the predicted peak is {fmt.gib(-headroom)} over {fmt.gib(capacity)}."
    if share > 0.8:
        for other in ("stream", "drain"):
            other_peak = int(MODE_RATIO[other] * bytes_to_place)
            if other != mode and MODE_RATIO[other] < MODE_RATIO[mode] and in_use + other_peak <= capacity:
                message += f" {other} ({MODE_RATIO[other]:.2f}×) fits with {fmt.gib(capacity - in_use - other_peak)} headroom."
                break
    return Forecast(in_use, predicted, capacity, share, message)
