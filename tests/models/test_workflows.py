"""fl2va and ref2va on the tiny H3 checkpoint: the seed contract against diffusers' own pipeline, the stage plan,
input images, VAE knobs and a few-step scheduler config."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from machine.device import DeviceInfo
from models.params import GenerateParams, GenerateParamsError
from models.pipeline import VAE_TILING_WARNING, PipelineEvent, load_stage, run_generate
from models.workflows import stage_plan, workflow_components

UNIFIED = DeviceInfo(spec="cpu", kind="cpu", index=None, name="fake unified GPU", unified_memory=True,
                     total_memory=8 * 2**30, source="test", reason="a unified device for tests")
BASE = GenerateParams(prompt="a red fox in the snow", frames=124, height=64, width=64, steps=3, seed=7)


@pytest.fixture(scope="module")
def keyframe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 80x48 PNG: not the 64x64 canvas, so diffusers resizes it."""
    path = tmp_path_factory.mktemp("images") / "frame.png"
    Image.fromarray((np.random.RandomState(0).rand(48, 80, 3) * 255).astype(np.uint8)).save(path)
    return path


def diffusers_digest(root: Path, workflow: str, steps: int = 3, **inputs) -> str:
    """The frames digest of diffusers' own `from_pretrained(workflow=...)` + `load_components` in bfloat16."""
    from diffusers import ModularPipeline

    from models.components import load_aux

    pipe = ModularPipeline.from_pretrained(str(root), workflow=workflow)
    pipe.load_components(dtype=torch.bfloat16)
    if pipe.processor is None:  # Qwen3VLProcessor's video part needs torchvision, which this box lacks
        pipe.update_components(processor=load_aux(root, "processor"))
    state = pipe(prompt=BASE.prompt, num_frames=BASE.frames, height=BASE.height, width=BASE.width,
                 num_inference_steps=steps, generator=torch.Generator("cpu").manual_seed(BASE.seed),
                 output_type="np", **inputs)
    return hashlib.sha256(np.ascontiguousarray(np.asarray(state.get("videos"))[0], np.float32).tobytes()).hexdigest()


def _rgb(path: Path):
    return Image.open(path).convert("RGB")


@pytest.mark.parametrize("fields", [("image",), ("last_image",), ("image", "last_image")])
def test_fl2va_frames_equal_diffusers_own_pipeline(h3_tiny: Path, keyframe: Path, tmp_path: Path, fields):
    params = replace(BASE, **{f: str(keyframe) for f in fields})
    events: list[PipelineEvent] = []
    result = run_generate(h3_tiny, params, tmp_path / "c.mp4", device_info=UNIFIED, on_event=events.append)
    assert result.workflow == "fl2va"
    assert result.video_sha256 == diffusers_digest(h3_tiny, "fl2va", **{f: _rgb(keyframe) for f in fields})
    assert all("80x48" in result.inputs[f]["note"] for f in fields)
    assert [e.message for e in events if e.kind == "note"] == result.notes and len(result.notes) == len(fields)


def test_ref2va_frames_equal_diffusers_own_pipeline_and_only_transformer_ref_is_loaded(
        h3_tiny: Path, keyframe: Path, tmp_path: Path):
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

    events: list[PipelineEvent] = []
    result = run_generate(h3_tiny, replace(BASE, ref_image=str(keyframe)), tmp_path / "c.mp4", device_info=UNIFIED,
                          on_event=events.append)
    assert result.workflow == "ref2va"
    assert result.video_sha256 == diffusers_digest(h3_tiny, "ref2va",
                                                   references=[MiniMaxH3ImageReference(image=_rgb(keyframe))])
    assert "transformer" not in result.loads and "transformer_ref" in result.loads
    held = [{c for c, w in r["components"].items() if w["mechanism"] != "released"} for r in result.residency]
    assert not any({"transformer", "transformer_ref"} <= h for h in held)
    assert {"transformer_ref"} in held  # alone while it denoises


def test_the_vision_tower_is_read_for_image_workflows_only(h3_tiny: Path, keyframe: Path, tmp_path: Path):
    t2va = run_generate(h3_tiny, replace(BASE, steps=2, audio=False), tmp_path / "a.mp4", device_info=UNIFIED)
    fl2va = run_generate(h3_tiny, replace(BASE, steps=2, audio=False, image=str(keyframe)), tmp_path / "b.mp4",
                         device_info=UNIFIED)
    skipped = {r.workflow: r.loads["text_encoder"]["excluded_bytes"] for r in (t2va, fl2va)}
    assert skipped["t2va"] > skipped["fl2va"] > 0  # lm_head and the layers past 50 are skipped by both


def test_sequential_plan_releases_the_vae_around_the_dit_and_never_holds_two_large_components(
        h3_tiny: Path, keyframe: Path, tmp_path: Path):
    events: list[PipelineEvent] = []
    result = run_generate(h3_tiny, replace(BASE, steps=2, image=str(keyframe)), tmp_path / "c.mp4",
                          device_info=UNIFIED, on_event=events.append)
    loads = [e.data["component"] for e in events if e.kind == "load"]
    assert loads == ["text_encoder", "vae", "transformer", "vae", "audio_vae"]
    assert result.stages.count(load_stage("vae")) == 2
    plan = {s.block: s.resident for s in stage_plan("fl2va")}
    assert plan["denoise.denoise"] == ("transformer",) and plan["vae_encoder"] == ("vae",)
    assert [r["block"] for r in result.residency] == list(plan)


def test_stage_plans_as_data_for_every_workflow():
    assert workflow_components("t2va") == ("text_encoder", "transformer", "vae", "audio_vae")
    assert workflow_components("ref2va") == ("text_encoder", "vae", "audio_vae", "transformer_ref")
    assert workflow_components("fl2va", audio=False) == ("text_encoder", "vae", "transformer")
    for workflow in ("t2va", "fl2va", "ref2va"):
        for sequential in (True, False):
            plan = stage_plan(workflow, sequential=sequential)
            assert not any({"transformer", "transformer_ref"} <= set(s.resident) for s in plan)
            if sequential:
                assert max(len(s.resident) for s in plan) <= 2  # ref2va's encoder: both VAEs
    everything = stage_plan("t2va", sequential=False)
    assert everything[0].loads == workflow_components("t2va") and all(len(s.resident) == 4 for s in everything)
    assert stage_plan("t2va")[0].to_dict() == {"block": "text_encoder", "reads": ("text_encoder",),
                                               "loads": ("text_encoder",), "resident": ("text_encoder",),
                                               "releases": ("text_encoder",)}


def test_vae_tiling_off_is_recorded_warned_and_applied(h3_tiny: Path, tmp_path: Path):
    events: list[PipelineEvent] = []
    result = run_generate(h3_tiny, replace(BASE, steps=2, audio=False, vae_tiling=False), tmp_path / "c.mp4",
                          device_info=UNIFIED, on_event=events.append)
    assert result.vae_tiling is False and VAE_TILING_WARNING in result.notes
    assert any(e.kind == "note" and e.message == VAE_TILING_WARNING for e in events)


def test_fp32_vae_decodes_in_the_checkpoint_s_precision(h3_tiny: Path, tmp_path: Path):
    bf16 = run_generate(h3_tiny, replace(BASE, steps=2, audio=False), tmp_path / "a.mp4", device_info=UNIFIED)
    fp32 = run_generate(h3_tiny, replace(BASE, steps=2, audio=False, vae_dtype="fp32"), tmp_path / "b.mp4",
                        device_info=UNIFIED)
    assert fp32.vae_dtype == "fp32" and fp32.loads["vae"]["bytes_placed"] > bf16.loads["vae"]["bytes_placed"]
    assert fp32.video_sha256 != bf16.video_sha256


def test_a_few_step_checkpoint_runs_its_own_steps_and_shift(h3_tiny: Path, tmp_path: Path):
    root = tmp_path / "distilled"
    shutil.copytree(h3_tiny, root)
    for name in ("scheduler", "audio_scheduler"):
        config = root / name / "scheduler_config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), "shift": 5.0, "num_inference_steps": 4}))
    events: list[PipelineEvent] = []
    params = replace(BASE, steps=None)
    result = run_generate(root, params, tmp_path / "c.mp4", device_info=UNIFIED, on_event=events.append)
    assert result.num_inference_steps == 4 and result.steps == 3
    assert [e.data["step"] for e in events if e.kind == "step"] == [1, 2, 3]  # 4 steps, 3 DiT calls
    assert result.video_sha256 == diffusers_digest(root, "t2va", steps=4)
    assert result.video_sha256 != diffusers_digest(h3_tiny, "t2va", steps=4)  # shift 5 is not 12


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"workflow": "fl2va"}, "workflow", "fl2va needs image or last_image"),
        ({"workflow": "t2va", "image": "x.png"}, "image", "t2va takes no image"),
        ({"ref_image": "x.png", "workflow": "ref2va", "image": "x.png"}, "image", "ref2va takes no image"),
        ({"workflow": "i2v"}, "workflow", "expected one of t2va, fl2va, ref2va"),
        ({"vae_dtype": "fp16"}, "vae_dtype", "expected one of bf16, fp32"),
        ({"quantize": "int4"}, "quantize", "expected one of int8, fp8"),
    ],
)
def test_workflow_mismatches_are_refused_naming_the_field(h3_tiny: Path, tmp_path: Path, change, field, message):
    with pytest.raises(GenerateParamsError) as caught:
        run_generate(h3_tiny, replace(BASE, **change), tmp_path / "c.mp4", device_info=UNIFIED)
    assert message in caught.value.problems[field]
