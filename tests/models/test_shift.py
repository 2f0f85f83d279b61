"""A per-run `shift`: the video scheduler's sigma shift, validated, handed to diffusers as a scheduler built with it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from models.cli import build_parser
from models.checkpoint.components import load_aux
from models.request.params import MAX_SHIFT, GenerateParams, GenerateParamsError, ModelSpec, validate_params
from models.run.pipeline import run_generate
from models.request.cli_args import workflow_fields

from .test_pipeline import UNIFIED

CLIP = GenerateParams(prompt="a red fox in the snow", frames=124, height=64, width=64, steps=3, seed=7, audio=False)


def _timesteps(root: Path, params: GenerateParams, out: Path):
    events = []
    result = run_generate(root, params, out, device_info=UNIFIED, on_event=events.append)
    return result, [e.data["timestep"] for e in events if e.kind == "step"]


def test_a_scheduler_built_with_a_shift_has_other_sigmas(h3_tiny: Path):
    own, shifted = load_aux(h3_tiny, "scheduler"), load_aux(h3_tiny, "scheduler", shift=3.0)
    own.set_timesteps(4)
    shifted.set_timesteps(4)
    assert shifted.shift == 3.0 and own.shift == ModelSpec.read(h3_tiny).shift
    assert own.sigmas.tolist() != shifted.sigmas.tolist()


def test_a_shift_changes_the_timesteps_and_frames_and_none_keeps_the_config_s(h3_tiny: Path, tmp_path: Path):
    config_shift = ModelSpec.read(h3_tiny).shift
    assert config_shift is not None and config_shift != 3.0
    unset, unset_steps = _timesteps(h3_tiny, CLIP, tmp_path / "a.mp4")
    same, same_steps = _timesteps(h3_tiny, replace(CLIP, shift=config_shift), tmp_path / "b.mp4")
    other, other_steps = _timesteps(h3_tiny, replace(CLIP, shift=3.0), tmp_path / "c.mp4")
    assert unset.shift == same.shift == config_shift and other.shift == 3.0
    assert unset_steps == same_steps and unset.video_sha256 == same.video_sha256
    assert other_steps != unset_steps and other.video_sha256 != unset.video_sha256


@pytest.mark.parametrize("shift", [0.0, -1.0, float("nan"), float("inf"), MAX_SHIFT * 2, "3"])
def test_a_shift_that_is_not_a_positive_finite_number_is_refused(h3_tiny: Path, shift):
    with pytest.raises(GenerateParamsError) as e:
        validate_params(replace(CLIP, shift=shift), ModelSpec.read(h3_tiny))
    assert set(e.value.problems) == {"shift"}


def test_generate_and_forecast_take_shift(h3_tiny: Path):
    for command in ("generate", "forecast"):
        args = build_parser().parse_args([command, str(h3_tiny), "--prompt", "p", "--out", "x.mp4", "--shift", "5"])
        assert workflow_fields(args)["shift"] == 5.0


def test_models_generate_takes_a_loras_stated_steps_and_shift_unless_given(h3_tiny: Path, tmp_path: Path, capsys):
    from models.cli import _with_stated_schedule
    from models.lora.inputs import LoraInput

    from .lora_files import write_peft_lora

    turbo = write_peft_lora(tmp_path / "turbo.safetensors", h3_tiny, modules=["proj_out"],
                            metadata={"num_inference_steps": "4", "shift": "5"})
    stated = _with_stated_schedule(str(h3_tiny), replace(CLIP, steps=None, loras=(LoraInput(str(turbo)),)))
    assert (stated.steps, stated.shift) == (4, 5.0)
    assert "shift 5: stated by LoRA 'turbo.safetensors'" in capsys.readouterr().err
    given = _with_stated_schedule(str(h3_tiny), replace(CLIP, steps=6, shift=2.0, loras=(LoraInput(str(turbo)),)))
    assert (given.steps, given.shift) == (6, 2.0)
