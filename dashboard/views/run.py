"""What the Run form offers, as plain functions: the modes, the offload flags a user may set,
the policy's preview, and the form's values read from a stored job spec (edit and re-queue).

The offload preview is the loader's own pure policy function, so what the page
shows is what the job will do.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping

import pandas as pd

from dashboard import format as fmt
from core.dtype_names import dtype_names
from dashboard import words
from machine.device import DeviceInfo
from machine.offload import OffloadSettings, resolve_offload
from models.request.params import GenerateParams
from models.speed.levers import STEP_CACHES
from models.request.cli_args import QUANTIZATIONS, VAE_DTYPES

OFFERED_FLAGS = ("dit_layerwise_offload", "dit_cpu_offload", "text_encoder_cpu_offload", "vae_cpu_offload")
"""The offload flags some code reads; the form offers only these (every control must change
what runs). The others keep OffloadSettings' defaults in the spec."""

CHECKPOINT_DTYPE = "checkpoint dtype"
"""The dtype control's choice that keeps the checkpoint's own."""


def dtype_choices() -> tuple[str, ...]:
    """The dtype control's choices: the checkpoint's own, then the one vocabulary's names (`core.dtype_names`)."""
    return (CHECKPOINT_DTYPE, *dtype_names())

FIELD_LABELS = {
    "model": "Checkpoint", "component": "Component to load", "kind": "Job", "mode": "Placement mode",
    "device": "Device", "dtype": "dtype", "sample_every": "Sample memory every N tensors",
    "memory_limit": "Memory limit (cgroup)", "gpus": "GPUs (ranks)", "memory_budget": "Memory budget (guard)",
    "memory_floor": "MemAvailable floor (guard)", "drop_page_cache": "Drop page cache after reading",
    "skeleton": "Load as a generic checkpoint (skeleton)", "sequential_components": "One component at a time",
    "offload": "Offload", "forecast": "Will it fit", "generate": "Generate",
    "generate.prompt": "Prompt", "generate.frames": "Frames (24 fps)", "generate.height": "Height",
    "generate.width": "Width", "generate.steps": "Steps", "generate.shift": "Shift", "generate.seed": "Seed", "generate.audio": "Audio track",
    "generate.workflow": "Workflow",
    **{f"generate.{field}": role.capitalize() for field, role in {**words.INPUT_WORDS, **words.CLIP_WORDS}.items()},
    "generate.vae_tiling": "VAE tiling (256 px tiles)", "generate.vae_dtype": "VAE decode precision",
    "generate.quantize": "Transformer weights", "generate.attention": "Attention backend",
    "generate.compile": "Regional compile", "generate.step_cache": "Step cache",
    "generate.vae_compile": "VAE decoder compile",
    "generate.parallel": "GPUs for this clip (ranks)",
    "plan": "Plan: fastest that fits", "plan_lossy": "Allow lossy levers",
}
"""The Run form's field labels by spec field: the widgets are drawn with them and every message names a field
by them ("Width"), never by the spec's name (`generate.width`)."""


def field_label(name: str) -> str:
    """The form's label of a spec field (`Width` for `generate.width`); an unknown one in words."""
    if name in FIELD_LABELS:
        return FIELD_LABELS[name]
    said = name.rpartition(".")[2].split("[")[0].replace("_", " ")
    return said[:1].upper() + said[1:]


DEFAULT_COMPONENT = ""
"""The component field's value for "the loader's default" (a selectbox shows None as no choice)."""

GENERATE_FIELDS = ("prompt", "frames", "height", "width", "steps", "shift", "seed", "audio", "vae_tiling", "vae_dtype", "quantize",
                   "attention", "compile", "step_cache", "vae_compile", "parallel")
"""GenerateParams fields the form edits, in form order (H3 fixes the rest: no negative prompt, no guidance, 24 fps;
the workflow and its images are the workflow section's)."""
QUANTIZE_NONE = "none"
"""The quantize control's value for GenerateParams.quantize = None (a selectbox shows None as no choice)."""
QUANTIZE_CHOICES = (QUANTIZE_NONE, *QUANTIZATIONS)
"""What the quantize control offers: the spec's own names (`--quantize int8|fp8`), or none."""
STEP_CACHE_CHOICES = (QUANTIZE_NONE, *STEP_CACHES)
"""What the step-cache control offers: the spec's own names (`--step-cache`), or none."""
VAE_DTYPE_CHOICES = VAE_DTYPES
"""What the VAE precision control offers: the spec's own names (`--vae-dtype bf16|fp32`)."""
FIRST_VISIT_STEPS = 3
"""Pre-filled steps (2 DiT calls): keeps the CPU demo near a minute; H3's own default is 50."""


def offload_preview(settings: OffloadSettings, device: DeviceInfo, flags: tuple[str, ...] = OFFERED_FLAGS,
                    decided: tuple[OffloadSettings, list] | None = None) -> pd.DataFrame:
    """Each offered flag: as requested, as the job will use it, and why it changed. `decided`: the job's own
    answer (jobs.probe.job_offload: fit-aware for a generate on a discrete GPU); else the plain policy's."""
    resolved, decisions = decided or resolve_offload(settings, device)
    why = {d.flag: d.reason for d in decisions}
    return pd.DataFrame(
        [
            {"setting": words.flag(name), "requested": getattr(settings, name), "used": getattr(resolved, name),
             "why": words.flags_in(why.get(name, "kept as requested"))}
            for name in flags
        ]
    )


def offload_summary(preview: pd.DataFrame, device: DeviceInfo) -> str:
    """One line for the collapsed offload section: what runs where on `device`."""
    if device.kind == "cpu":
        return "Offload: everything runs on the CPU, so offload does not apply"
    changed = preview[preview["requested"] != preview["used"]]
    if changed.empty:
        return f"Offload on {device.spec}: as you set it below"
    if not device.unified_memory:
        return (f"Offload on {device.spec}: {len(changed)} of {len(preview)} settings follow this job's forecast "
                "(components stay on the GPU where they fit)")
    return (f"Offload on {device.spec}: unified memory, so {len(changed)} of {len(preview)} settings are off "
            "(the GPU and CPU share one pool: moving weights to the CPU frees nothing)")


def size_text(nbytes: int | None) -> str:
    """A byte count as the size parser reads it back exactly, in the unit the user most likely
    typed: `8GiB`, `700MiB`, `300MB`, `2GB`, or plain bytes. A stored spec keeps only bytes, so
    binary units are tried first (they are exact for what the page suggests), then decimal ones."""
    if nbytes is None:
        return ""
    for unit, size in (("GiB", fmt.GIB), ("MiB", fmt.MIB), ("GB", 10**9), ("MB", 10**6)):
        if nbytes % size == 0:
            return f"{nbytes // size}{unit}"
    return str(nbytes)


POLICY_DEFAULT = "policy default"
TRISTATE = {POLICY_DEFAULT: None, "on": True, "off": False}
"""The form's choices for a bool spec field where None leaves it to the policy, and their values."""


def tristate_text(value: bool | None) -> str:
    """The form's choice for a value of such a field."""
    return next(text for text, v in TRISTATE.items() if v is value)


def form_values(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The Run form's field values (field name -> value) that reproduce a stored job spec."""
    values: dict[str, Any] = {
        "kind": spec.get("kind", "load"),
        "checkpoint": spec.get("model"),
        "component": spec.get("component") or DEFAULT_COMPONENT,
        "mode": spec.get("mode", "stream"),
        "device": spec.get("device", "cpu"),
        "dtype": spec.get("dtype") or CHECKPOINT_DTYPE,
        "sample_every": int(spec.get("sample_every", 1)),
        "memory_limit": size_text(spec.get("memory_limit")),
        "memory_budget": size_text(spec.get("memory_budget")),
        "memory_floor": size_text(spec.get("memory_floor")),
        "drop_page_cache": tristate_text(spec.get("drop_page_cache")),
        "sequential_components": tristate_text(spec.get("sequential_components")),
        "gpus": int(spec.get("gpus", 1)),
        "skeleton": bool(spec.get("skeleton", False)),
        "plan": spec.get("plan") is not None,
        "plan_lossy": bool(spec.get("plan_lossy", False)),
    }
    offload = {**OffloadSettings().to_dict(), **(spec.get("offload") or {})}
    values.update({f"offload_{name}": bool(offload[name]) for name in OFFERED_FLAGS})
    generate = spec.get("generate") or {}
    values.update({f"gen_{name}": value for name, value in generate.items() if name in GENERATE_FIELDS})
    if generate:
        values["gen_workflow"] = workflow_of(generate)
    for name in ("gen_quantize", "gen_step_cache"):
        if name in values:
            values[name] = quantize_choice(values[name])
    if generate:
        loras = [lora for lora in generate.get("loras") or [] if isinstance(lora, dict) and lora.get("file")]
        values["gen_loras"] = [lora["file"] for lora in loras]
        values.update({lora_scale_field(lora["file"]): float(lora.get("scale", 1.0)) for lora in loras})
    return values | kind_form_values(spec)


def kind_form_values(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The values of the fields a kind declares for the form (`JobKind.form_fields`), from a stored spec of it; none
    for a kind no longer registered."""
    from jobs.kinds import get_kind

    try:
        declared = get_kind(spec.get("kind", "load")).form_fields
    except KeyError:
        return {}
    return {f.name: spec[f.name] for f in declared if spec.get(f.name) is not None}


def lora_scale_field(path: str) -> str:
    """The form field holding the strength of the LoRA at `path`."""
    return f"gen_lora_scale:{path}"


def workflow_of(generate: Mapping[str, Any]) -> str:
    """The workflow a stored spec's `generate` mapping ran: the one it names, else the one its inputs select."""
    from models.request.params import INPUT_FILE_FIELDS, GenerateParams

    given = {name: generate.get(name) for name in ("workflow", *INPUT_FILE_FIELDS)}
    return GenerateParams(prompt="", **given).resolved_workflow


def quantize_choice(value: str | None) -> str:
    """The quantize (or step-cache) control's value for GenerateParams.quantize (or .step_cache)."""
    return QUANTIZE_NONE if value is None else value


def quantize_value(choice: str) -> str | None:
    """GenerateParams.quantize (or .step_cache) for the quantize (or step-cache) control's value."""
    return None if choice == QUANTIZE_NONE else choice


def generate_defaults(prompt: str, canvas: tuple[int, int]) -> dict[str, Any]:
    """Form values of GenerateParams' defaults with `prompt`, the checkpoint's (height, width) canvas and
    FIRST_VISIT_STEPS."""
    base = GenerateParams(prompt=prompt, height=canvas[0], width=canvas[1], steps=FIRST_VISIT_STEPS)
    values = {f"gen_{f.name}": getattr(base, f.name) for f in fields(GenerateParams) if f.name in GENERATE_FIELDS}
    return values | {"gen_quantize": quantize_choice(base.quantize), "gen_step_cache": quantize_choice(base.step_cache)}


def generate_geometry(path: str | None) -> tuple[tuple[int, int], int]:
    """A checkpoint's default (height, width) canvas and the multiple sizes must be; H3's release where the
    folder is no H3 root."""
    from models.request.params import GenerateParamsError, ModelSpec

    try:
        spec = ModelSpec.read(path)
    except (GenerateParamsError, TypeError):
        return (768, 1344), 32
    return spec.canvas, spec.canvas_multiple
