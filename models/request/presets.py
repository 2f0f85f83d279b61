"""Few-step presets as data: `presets.json` names each one's steps, shift and LoRA file (by file name, found under
the model roots) and the scale; one reader, no code per preset.

A field a publisher does not state is null and the run's own value (or the LoRA's stated one, or the checkpoint's)
applies. Values a request gives win over the preset's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Iterable

from core.echo import echo
from core.errors import DrainboardError

from ..lora.inputs import LoraInput, check_scale, find_lora_files
from .params import GenerateParams, shift_problem

PRESETS_FILE = Path(__file__).with_name("presets.json")
"""The presets shipped with Drainboard."""


class PresetError(DrainboardError):
    """A preset that cannot be used: an unknown name, a bad presets file, or its LoRA file not found."""


@dataclass(frozen=True)
class Preset:
    """One few-step recipe."""

    name: str
    """What `--preset` and the Run page call it."""
    steps: int | None = None
    """`num_inference_steps`; None: not stated."""
    shift: float | None = None
    """The video scheduler's sigma shift; None: not stated."""
    lora: str | None = None
    """The LoRA's file name, looked for under the model roots; None: the request names its LoRA."""
    scale: float = 1.0
    """The LoRA's strength."""
    source: str = ""
    """Where the figures come from (whose they are, and what is not stated)."""

    def fields(self, roots: Iterable[str | os.PathLike]) -> dict[str, Any]:
        """The GenerateParams fields it fills: steps, shift and its LoRA (first in the stack) where stated."""
        values: dict[str, Any] = {k: getattr(self, k) for k in ("steps", "shift") if getattr(self, k) is not None}
        if self.lora is not None:
            values["loras"] = (LoraInput(str(find_preset_lora(self, roots)), self.scale),)
        return values


def read_presets(path: str | os.PathLike | None = None) -> dict[str, Preset]:
    """The presets of `path` (default `PRESETS_FILE`) by name; PresetError naming the file, the entry and the field
    when one is malformed."""
    from loader.confined import read_json_checked

    path = PRESETS_FILE if path is None else path
    try:
        entries = read_json_checked(Path(path))
    except (OSError, DrainboardError) as exc:
        raise PresetError(f"cannot read the presets {path}: {exc}") from None
    if not isinstance(entries, list):
        raise PresetError(f"{path}: expected a list of presets, got {type(entries).__name__}")
    presets: dict[str, Preset] = {}
    for i, entry in enumerate(entries):
        preset = _preset(entry, f"{path}: preset {i}")
        if preset.name in presets:
            raise PresetError(f"{path}: preset {echo(preset.name)} is named twice")
        presets[preset.name] = preset
    return presets


def _preset(entry: Any, where: str) -> Preset:
    if not isinstance(entry, dict):
        raise PresetError(f"{where}: expected an object, got {type(entry).__name__}")
    known = {f.name for f in fields(Preset)}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise PresetError(f"{where}: unknown field(s) {', '.join(echo(u) for u in unknown)}; known: {', '.join(sorted(known))}")
    name, steps, shift, lora = (entry.get(k) for k in ("name", "steps", "shift", "lora"))
    if not isinstance(name, str) or not name.strip():
        raise PresetError(f"{where}: name must be a non-empty string, got {echo(name)}")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or not 2 <= steps <= 1000):
        raise PresetError(f"{where} ({echo(name)}): steps must be an integer in 2..1000 or null, got {echo(steps)}")
    if shift_problem(shift) is not None:
        raise PresetError(f"{where} ({echo(name)}): shift {shift_problem(shift)}")
    if lora is not None and (not isinstance(lora, str) or Path(lora).name != lora or not lora.endswith(".safetensors")):
        raise PresetError(f"{where} ({echo(name)}): lora must be a .safetensors file name (no folder) or null,"
                          f" got {echo(lora)}")
    try:
        scale = check_scale(entry.get("scale", 1.0))
    except ValueError as e:
        raise PresetError(f"{where} ({echo(name)}): {e}") from None
    return Preset(name, steps, None if shift is None else float(shift), lora, scale, str(entry.get("source", "")))


def get_preset(name: str, path: str | os.PathLike | None = None) -> Preset:
    """The preset called `name`, or PresetError listing the known ones."""
    presets = read_presets(path)
    if name not in presets:
        raise PresetError(f"no preset {echo(name)}; known: {', '.join(echo(n) for n in presets) or 'none'}")
    return presets[name]


def find_preset_lora(preset: Preset, roots: Iterable[str | os.PathLike]) -> Path:
    """The LoRA file the preset names, found by file name among the LoRA files under `roots`
    (`models.lora.inputs.find_lora_files`); PresetError naming where it looked when there is none."""
    roots = [str(r) for r in roots]
    for found in find_lora_files(roots):
        if Path(found.path).name == preset.lora:
            return Path(found.path)
    raise PresetError(f"preset {echo(preset.name)}: no LoRA file {echo(preset.lora)} under "
                      f"{', '.join(roots) or 'no model root'}; put it there or give --lora")


def with_preset(params: GenerateParams, name: str, roots: Iterable[str | os.PathLike],
                path: str | os.PathLike | None = None) -> GenerateParams:
    """`params` with preset `name`'s steps and shift where they are unset, and its LoRA first in the stack."""
    filled = get_preset(name, path).fields(roots)
    values = {k: v for k, v in filled.items() if k != "loras" and getattr(params, k) is None}
    if "loras" in filled:
        values["loras"] = (*filled["loras"], *params.loras)
    return replace(params, **values)
