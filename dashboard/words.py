"""The user's words for the names the runner and the pipeline use inside.

Stage names (`load.text_encoder`, `denoise.denoise`), event kinds (`stage_start`) and
offload flags (`dit_cpu_offload`) are how the job records what happened; they stay in
the JSON, the downloads and the tooltips. What a page shows in text goes through here.
"""

from __future__ import annotations

from jobs.stage_words import COMPONENT_WORDS, STAGE_WORDS, component, stage  # noqa: F401 (the pages' words too)

EVENT_WORDS = {
    "stage_start": "started",
    "stage_end": "finished",
    "step": "step",
    "load": "loaded",
    "release": "released",
    "placement": "placed",
    "offload_decision": "offload",
    "decision": "decision",
    "device": "device",
    "forecast": "forecast",
    "warning": "warning",
    "error": "error",
}
"""Event kinds, in words."""

INPUT_WORDS = {"image": "first frame", "last_image": "last frame", "ref_image": "reference image"}
"""A generate job's input image, by its GenerateParams field (and its copy's name in the job folder)."""
CLIP_WORDS = {"ref_video": "reference clip"}
"""A generate job's input clip, by its GenerateParams field (its copy is `ref_video.mp4`)."""

FLAG_WORDS = {
    "dit_layerwise_offload": "transformer streamed layer by layer from the CPU",
    "dit_cpu_offload": "transformer kept on the CPU between passes",
    "text_encoder_cpu_offload": "text encoder kept on the CPU between uses",
    "image_encoder_cpu_offload": "image encoder kept on the CPU between uses",
    "vae_cpu_offload": "video decoder kept on the CPU between uses",
    "pin_cpu_memory": "pinned CPU copies",
}
"""Offload flags, as what each one does."""


def event(kind: str | None) -> str:
    """`started` for `stage_start`."""
    if not kind:
        return ""
    return EVENT_WORDS.get(kind, kind.replace("_", " "))


def input_role(field: str) -> str:
    """`first frame` for `image`."""
    return INPUT_WORDS.get(field, field.replace("_", " "))


def flag(name: str) -> str:
    """What an offload flag does, in words."""
    return FLAG_WORDS.get(name, name.replace("_", " "))


def flags_in(text: str) -> str:
    """`text` with every offload flag it names said in words (the loader's reasons name them)."""
    for name in sorted(FLAG_WORDS, key=len, reverse=True):
        text = text.replace(name, f"“{FLAG_WORDS[name]}”")
    return text


def steps(total: int | None) -> str:
    """`3 steps = 2 transformer passes`: N steps make N - 1 passes of the transformer."""
    if not total:
        return "steps: the model's default"
    passes = max(0, int(total) - 1)
    return f"{total} steps = {passes} transformer pass{'es' if passes != 1 else ''}"
