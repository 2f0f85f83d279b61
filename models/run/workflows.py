"""MiniMax H3's three workflows as data: their blocks, the weights each block reads, and the stage plan.

The blocks are diffusers' own (`MiniMaxH3Blocks().get_workflow(name)`): which
weight component a block reads is its `expected_components`, nothing kept
here. The stage plan says what is resident in each block:

- with `sequential_components`, a component is loaded just before a block
  that reads it and released after it, unless the next block that reads any
  weight reads it too. `fl2va` and `ref2va` encode their images with the VAE
  before denoising and decode with it after: the VAE is released around the
  DiT and loaded a second time, so no two large components meet. `ref2va`
  denoises with `transformer_ref` and never reads `transformer`, so the two
  DiTs are never resident together in any mode;
- without it, every component the workflow reads is loaded before the first
  block and stays to the end.

The pipeline runs this plan; the forecast and the Run page read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

WORKFLOWS = ("t2va", "fl2va", "ref2va")
"""diffusers' MiniMax H3 workflows."""
WEIGHT_COMPONENTS = ("text_encoder", "transformer", "transformer_ref", "vae", "audio_vae")
"""Every component with weights a MiniMax H3 root may hold."""
DENOISE_LOOP = "denoise.denoise"
"""The workflow's denoising loop (each workflow's, by diffusers' name)."""
AUDIO_BLOCK = "decode.audio"
"""The block that decodes the soundtrack, left out when audio is off."""
WORKFLOW_INPUTS = {"t2va": (), "fl2va": ("image", "last_image"), "ref2va": ("ref_image",)}
"""The generate parameters naming an image file that each workflow takes."""
WORKFLOW_CLIPS = {"t2va": (), "fl2va": (), "ref2va": ("ref_video",)}
"""The generate parameters naming a video file (a reference clip) that each workflow takes."""


def workflow_inputs(workflow: str) -> tuple[str, ...]:
    """Every input file parameter of `workflow`: it needs at least one of them (fl2va a keyframe, ref2va a
    reference image or clip; ref2va conditions on the image first, then the clip)."""
    return WORKFLOW_INPUTS[workflow] + WORKFLOW_CLIPS[workflow]


@dataclass(frozen=True)
class PlannedStage:
    """One block of a workflow and the weights around it."""

    block: str
    """diffusers' block name in the flattened workflow (`text_encoder`, `denoise.denoise`, ...)."""
    reads: tuple[str, ...]
    """Weight components the block calls."""
    loads: tuple[str, ...]
    """Components loaded just before the block (each in its own `load.<name>` stage)."""
    resident: tuple[str, ...]
    """Components holding weights while the block runs."""
    releases: tuple[str, ...]
    """Components released (sequential) or offloaded back to the host (model offload) after the block."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_workflow(workflow: str) -> str:
    """`workflow`, or ValueError listing the known ones."""
    if workflow not in WORKFLOWS:
        raise ValueError(f"unknown workflow {workflow!r}; known: {', '.join(WORKFLOWS)}")
    return workflow


def workflow_blocks(workflow: str, audio: bool = True):
    """diffusers' blocks of `workflow` (a fresh SequentialPipelineBlocks), without `decode.audio` when `audio` is off."""
    from diffusers import MiniMaxH3Blocks

    blocks = MiniMaxH3Blocks().get_workflow(check_workflow(workflow))
    if not audio:
        blocks.sub_blocks.pop(AUDIO_BLOCK)
    return blocks


def block_reads(blocks) -> dict[str, tuple[str, ...]]:
    """Block name -> the weight components it reads, in the workflow's order."""
    return {name: tuple(c.name for c in block.expected_components if c.name in WEIGHT_COMPONENTS)
            for name, block in blocks.sub_blocks.items()}


def workflow_components(workflow: str, audio: bool = True) -> tuple[str, ...]:
    """The weight components `workflow` reads, in the order of first use."""
    return _first_use(block_reads(workflow_blocks(workflow, audio)))


def stage_plan(workflow: str, *, audio: bool = True, sequential: bool = True) -> list[PlannedStage]:
    """The workflow's blocks in order with what is loaded, resident and released around each."""
    return plan_from_reads(block_reads(workflow_blocks(workflow, audio)), sequential)


def plan_from_reads(reads: dict[str, tuple[str, ...]], sequential: bool) -> list[PlannedStage]:
    """The stage plan of blocks that read `reads` (see the module docstring for the rule)."""
    names = list(reads)
    everything = _first_use(reads)
    plan, held = [], []
    for i, name in enumerate(names):
        if sequential:
            loads = tuple(c for c in reads[name] if c not in held)
        else:
            loads = everything if i == 0 else ()
        held += loads
        nxt = next((reads[n] for n in names[i + 1:] if reads[n]), None)
        if sequential:
            releases = tuple(c for c in reads[name] if nxt is None or c not in nxt)
        else:
            releases = tuple(c for c in everything if _last_use(reads, c) == name)
        plan.append(PlannedStage(name, reads[name], loads, tuple(held), releases))
        if sequential:
            held = [c for c in held if c not in releases]
    return plan


def _first_use(reads: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(c for block in reads.values() for c in block))


def _last_use(reads: dict[str, tuple[str, ...]], component: str) -> str:
    return [name for name, used in reads.items() if component in used][-1]
