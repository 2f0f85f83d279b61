"""Drainboard's own blocks in diffusers' workflow: placed around every block, transparent to its data, and a block
that raises leaves no stage sampling behind."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from machine.device import DeviceInfo
from machine.offload import OffloadSettings
from models.run import state as run_state
from models.request.params import GenerateParams
from models.run.pipeline import run_generate
from models.run.results import GenerateResult
from models.run.state import RunState
from models.run.stage_blocks import DENOISE_LOOP, REPORT_STEP, ReportStep, StageEnd, StageStart, staged_workflow
from models.run.workflows import WORKFLOWS, block_reads, plan_from_reads, workflow_blocks

UNIFIED = DeviceInfo(spec="cpu", kind="cpu", index=None, name="fake unified GPU", unified_memory=True,
                     total_memory=8 * 2**30, source="test", reason="a unified device for tests")
SMALL = GenerateParams(prompt="a red fox in the snow", frames=124, height=64, width=64, steps=2, seed=7, audio=False)


def _staged(workflow: str):
    blocks = workflow_blocks(workflow)
    before = (blocks.inputs, blocks.intermediate_outputs, blocks.expected_components, blocks.expected_configs)
    names = list(blocks.sub_blocks)
    plan = plan_from_reads(block_reads(blocks), sequential=True)
    run = RunState(Path("."), None, torch.device("cpu"), torch.bfloat16, "stream", OffloadSettings(), {}, True,
                   None, None, 0.01, GenerateResult("x.mp4", 0, 24, 0.0, 0, 0, False), None)
    staged_workflow(blocks, plan, run)
    return blocks, names, before


@pytest.mark.parametrize("workflow", WORKFLOWS)
def test_every_block_sits_between_its_start_and_end_and_the_loop_ends_reporting_its_step(workflow: str):
    blocks, names, _ = _staged(workflow)
    assert list(blocks.sub_blocks) == [f"{n}{part}" for n in names for part in (":start", "", ":end")]
    kinds = [type(b) for b in blocks.sub_blocks.values()]
    assert kinds[0::3] == [StageStart] * len(names) and kinds[2::3] == [StageEnd] * len(names)
    loop = blocks.sub_blocks[DENOISE_LOOP]
    assert list(loop.sub_blocks)[-1] == REPORT_STEP and isinstance(loop.sub_blocks[REPORT_STEP], ReportStep)


@pytest.mark.parametrize("workflow", WORKFLOWS)
def test_our_blocks_leave_the_workflow_s_inputs_outputs_components_and_configs_as_diffusers_made_them(workflow: str):
    blocks, _, before = _staged(workflow)
    after = (blocks.inputs, blocks.intermediate_outputs, blocks.expected_components, blocks.expected_configs)
    assert [[p.name for p in part] for part in after] == [[p.name for p in part] for part in before]


def test_a_plan_that_is_not_the_workflow_s_blocks_is_refused_naming_both():
    blocks = workflow_blocks("t2va")
    plan = plan_from_reads(block_reads(blocks), sequential=True)[1:]
    with pytest.raises(ValueError, match="is not the workflow's blocks"):
        staged_workflow(blocks, plan, None)


def test_a_load_that_raises_mid_run_ends_with_no_stage_sampler_left_running(
        h3_tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    load_weights = run_state._load_weights

    def failing(run, name, target, *merging):
        if name == "transformer":
            raise RuntimeError("the disk went away")
        return load_weights(run, name, target, *merging)

    monkeypatch.setattr(run_state, "_load_weights", failing)
    events = []
    with pytest.raises(RuntimeError, match="the disk went away"):
        run_generate(h3_tiny, SMALL, tmp_path / "c.mp4", device_info=UNIFIED, on_event=events.append,
                     sample_interval=0.01)
    assert not [t for t in threading.enumerate() if t.name == "drainboard-sampler" and t.is_alive()]
    ended = [e.stage for e in events if e.kind == "stage_end"]
    assert "text_encoder" in ended and "load.transformer" not in ended


def test_a_block_that_raises_inside_its_stage_stops_that_stage_s_sampler(
        h3_tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def boom(self, components, block_state, i, t):
        raise RuntimeError("step failed")

    monkeypatch.setattr(ReportStep, "__call__", boom)
    events = []
    with pytest.raises(RuntimeError, match="step failed"):
        run_generate(h3_tiny, replace(SMALL, steps=3), tmp_path / "c.mp4", device_info=UNIFIED,
                     on_event=events.append, sample_interval=0.01)
    assert not [t for t in threading.enumerate() if t.name == "drainboard-sampler" and t.is_alive()]
    started = [e.stage for e in events if e.kind == "stage_start"]
    assert started[-1] == DENOISE_LOOP and DENOISE_LOOP not in [e.stage for e in events if e.kind == "stage_end"]
