"""Blocks of Drainboard's own, put into diffusers' workflow so that every block is a stage and every step an event.

diffusers' blocks run untouched. Around each one (`staged_workflow`) sits a
`StageStart` that loads what the stage plan loads before it and opens the
stage, and a `StageEnd` that closes it, records the residency and releases
what the plan releases after it. `ReportStep` is appended to the denoising
loop, which calls it after each step as it calls its own blocks, with the
step index `i` and the timestep `t`. The blocks read no input and write no
state, so the workflow's inputs and outputs stay diffusers'.

When a run has a step cache, `DenoiserCall` takes the place of the loop's
denoiser block and calls it inside the DiT's `cache_context` (the cache hooks
count steps only there), counting the calls the cache reuses
(`GenerateResult.steps_reused`). (A compiled DiT's calls that compile are cut
into a stage of their own by the run's hooks on the DiT, as a compiled VAE
decoder's are: `RunState.first_calls_apart`.)
"""

from __future__ import annotations

from diffusers import ModularPipelineBlocks

from ..speed.speedups import step_reused
from .state import RunState
from .workflows import DENOISE_LOOP, PlannedStage

REPORT_STEP = "report_step"
"""The name of our block inside the loop."""
DENOISER = "denoiser"
"""diffusers' block inside the loop that calls the DiT."""


class StageMarker(ModularPipelineBlocks):
    """A block of ours that stands at one edge of a planned stage; it reads no input and writes no state."""

    model_name = "minimax-h3"

    def __init__(self, run: RunState, stage: PlannedStage):
        super().__init__()
        self.run, self.stage = run, stage


class StageStart(StageMarker):
    """Loads the components the stage plan loads before the block, then opens the block's stage."""

    @property
    def description(self) -> str:
        return f"Drainboard: loads {', '.join(self.stage.loads) or 'nothing'} and opens stage {self.stage.block}."

    def __call__(self, components, state):
        for component in self.stage.loads:
            if component not in self.run.resident:
                self.run.load(component)
        self.run.begin(self.stage.block)
        return components, state


class StageEnd(StageMarker):
    """Closes the block's stage, records where each component lives, releases what the plan releases."""

    @property
    def description(self) -> str:
        return f"Drainboard: closes stage {self.stage.block} and releases {', '.join(self.stage.releases) or 'nothing'}."

    def __call__(self, components, state):
        self.run.end()
        self.run.observe(self.stage.block)
        for component in self.stage.releases:
            self.run.done_with(component)
        return components, state


class ReportStep(ModularPipelineBlocks):
    """The denoising loop's last block: reports each finished step."""

    model_name = "minimax-h3"

    def __init__(self, run: RunState):
        super().__init__()
        self.run = run

    @property
    def description(self) -> str:
        return "Drainboard: reports a finished denoising step."

    def __call__(self, components, block_state, i: int, t):
        step, total = i + 1, len(block_state.timesteps)
        self.run.result.steps = step
        self.run.result.steps_computed = step - self.run.result.steps_reused
        self.run.emit("step", f"step {step}/{total}", step=step, steps=total, timestep=float(t))
        return components, block_state


class DenoiserCall(ModularPipelineBlocks):
    """diffusers' denoiser block, called inside the DiT's cache context; its inputs, outputs and components are the
    inner block's."""

    model_name = "minimax-h3"

    def __init__(self, inner: ModularPipelineBlocks, run: RunState):
        super().__init__()
        self.inner, self.run = inner, run

    @property
    def description(self) -> str:
        return f"Drainboard: calls {type(self.inner).__name__} in the DiT's cache context."

    @property
    def expected_components(self):
        return self.inner.expected_components

    @property
    def inputs(self):
        return self.inner.inputs

    @property
    def intermediate_outputs(self):
        return self.inner.intermediate_outputs

    def __call__(self, components, block_state, i: int, t):
        transformer = getattr(components, self.inner.transformer_name)
        cache = self.run.levers["step_cache"]
        with transformer.cache_context("cond", step_index=i, num_inference_steps=len(block_state.timesteps),
                                       timestep=t):
            found = self.inner(components, block_state, i=i, t=t)
        # One DiT call per step, each inside the cache's one context: the hooks count calls as `i` does.
        if step_reused(cache, i):
            self.run.result.steps_reused += 1
        return found


def staged_workflow(blocks, plan: list[PlannedStage], run: RunState) -> None:
    """Edit the workflow's `sub_blocks` in place: each block between its StageStart and StageEnd, in plan order,
    and ReportStep at the end of the denoising loop (its denoiser in a DenoiserCall when the run has a step cache)."""
    original = dict(blocks.sub_blocks)
    if [stage.block for stage in plan] != list(original):
        raise ValueError(f"the stage plan ({[s.block for s in plan]}) is not the workflow's blocks ({list(original)})")
    loop = original[DENOISE_LOOP].sub_blocks
    if run.levers["step_cache"] is not None:
        loop[DENOISER] = DenoiserCall(loop[DENOISER], run)
    loop[REPORT_STEP] = ReportStep(run)
    blocks.sub_blocks.clear()
    for stage in plan:
        blocks.sub_blocks[f"{stage.block}:start"] = StageStart(run, stage)
        blocks.sub_blocks[stage.block] = original[stage.block]
        blocks.sub_blocks[f"{stage.block}:end"] = StageEnd(run, stage)
