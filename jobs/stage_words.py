"""Stage and component names in the user's words, the one vocabulary of the pages and the CLIs.

A job records its stages by their internal names (`load.text_encoder`, `denoise.denoise`, `encode` for writing
the MP4); what a person reads, on a page or in `jobs submit --wait`, goes through `stage` and `progress_text`.
"""

from __future__ import annotations

COMPONENT_WORDS = {
    "transformer": "transformer",
    "transformer_ref": "reference transformer",
    "text_encoder": "text encoder",
    "vae": "video decoder",
    "audio_vae": "audio decoder",
    "image_encoder": "image encoder",
}
"""A checkpoint component as the pages name it."""

STAGE_WORDS = {
    "probe": "starting the job",
    "prepare": "preparing the tokenizer and scheduler",
    "read_clip": "decoding the reference clip",
    "text_encoder": "encoding the prompt",
    "vae_encoder": "encoding the images",
    "load": "loading",
    "denoise.denoise": "denoising",
    "denoise.compile": "compiling the transformer (its first denoising steps)",
    "decode.compile": "compiling the video decoder (its first tile)",
    "decode.video": "decoding the video",
    "decode.audio": "decoding the audio",
    "encode": "writing the video",
}
"""Stages a job reports, in words (`encode` is models.run.state's MP4 write); `load.<component>` and other
`denoise.*` blocks are derived."""

COUNTED_STAGES = frozenset({"load", "denoise.denoise"})
"""The stages a job's progress counter counts in: tensors placed by a load, transformer passes by a generate.
After them the counter stays in the row, but it says nothing about a later stage."""


def component(name: str | None) -> str:
    """`text encoder` for `text_encoder`; unknown names lose their underscores."""
    if not name:
        return ""
    return COMPONENT_WORDS.get(name, name.replace("_", " "))


def stage(name: str | None) -> str:
    """`loading the text encoder` for `load.text_encoder`, `denoising` for `denoise.denoise`; "" for no stage."""
    if not name:
        return ""
    if name in STAGE_WORDS:
        return STAGE_WORDS[name]
    head, _, tail = name.partition(".")
    if head == "load" and tail:
        return f"loading the {component(tail)}"
    if head == "denoise":
        return "preparing to denoise"
    if head == "decode":
        return f"decoding the {component(tail) or 'output'}"
    return name.replace(".", " ").replace("_", " ")


def progress_text(stage_name: str | None, done: int | None, total: int | None) -> str:
    """`loading 13/41`, `denoising 1/2`, or the stage alone (`decoding the video`: the passes are over)."""
    said = stage(stage_name)
    if total and stage_name in COUNTED_STAGES:
        return f"{said} {done or 0}/{total}"
    return said
