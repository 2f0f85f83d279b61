"""fl2va and ref2va on the tiny H3 checkpoint: the seed contract against diffusers' own pipeline, the stage plan,
input images, VAE knobs and a few-step scheduler config."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from machine.device import DeviceInfo
from models.request.params import GenerateParams, GenerateParamsError
from models.run.pipeline import VAE_TILING_WARNING, run_generate
from models.run.results import PipelineEvent
from models.run.state import load_stage
from models.run.workflows import stage_plan, workflow_components

UNIFIED = DeviceInfo(spec="cpu", kind="cpu", index=None, name="fake unified GPU", unified_memory=True,
                     total_memory=8 * 2**30, source="test", reason="a unified device for tests")
BASE = GenerateParams(prompt="a red fox in the snow", frames=124, height=64, width=64, steps=3, seed=7)


@pytest.fixture(scope="module")
def keyframe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 80x48 PNG: not the 64x64 canvas, so diffusers resizes it."""
    path = tmp_path_factory.mktemp("images") / "frame.png"
    Image.fromarray((np.random.RandomState(0).rand(48, 80, 3) * 255).astype(np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 20-frame 80x48 MP4 at 25 fps with a 32 kHz stereo soundtrack: diffusers resamples it onto 24 fps and
    resizes it onto its own canvas, and the soundtrack (at the audio VAE's rate) is conditioned on as it is."""
    from models.video.encode import write_mp4

    path = tmp_path_factory.mktemp("clips") / "motion.mp4"
    rng = np.random.RandomState(2)
    wave = (rng.rand(2, 32000).astype(np.float32) - 0.5) * 0.2
    write_mp4(path, (rng.rand(20, 48, 80, 3) * 255).astype(np.uint8), 25, wave, 32000)
    return path


def diffusers_digest(root: Path, workflow: str, steps: int = 3, prepare=None, **inputs) -> str:
    """The frames digest of diffusers' own `from_pretrained(workflow=...)` + `load_components` in bfloat16;
    `prepare(pipe)` runs on the loaded pipeline first (a LoRA loaded and fused, say)."""
    from diffusers import ModularPipeline

    from models.checkpoint.components import load_aux

    pipe = ModularPipeline.from_pretrained(str(root), workflow=workflow)
    pipe.load_components(dtype=torch.bfloat16)
    if pipe.processor is None:  # Qwen3VLProcessor's video part needs torchvision, which this box lacks
        pipe.update_components(processor=load_aux(root, "processor"))
    if prepare is not None:
        prepare(pipe)
    state = pipe(prompt=BASE.prompt, num_frames=BASE.frames, height=BASE.height, width=BASE.width,
                 num_inference_steps=steps, generator=torch.Generator("cpu").manual_seed(BASE.seed),
                 output_type="np", **inputs)
    return hashlib.sha256(np.ascontiguousarray(np.asarray(state.get("videos"))[0], np.float32).tobytes()).hexdigest()


def _rgb(path: Path):
    return Image.open(path).convert("RGB")


@pytest.mark.slow
@pytest.mark.parametrize("fields", [("image",), ("last_image",), ("image", "last_image")])
def test_fl2va_frames_equal_diffusers_own_pipeline(h3_tiny: Path, keyframe: Path, tmp_path: Path, fields):
    params = replace(BASE, **{f: str(keyframe) for f in fields})
    events: list[PipelineEvent] = []
    result = run_generate(h3_tiny, params, tmp_path / "c.mp4", device_info=UNIFIED, on_event=events.append)
    assert result.workflow == "fl2va"
    assert result.video_sha256 == diffusers_digest(h3_tiny, "fl2va", **{f: _rgb(keyframe) for f in fields})
    assert all("80x48" in result.inputs[f]["note"] for f in fields)
    assert [e.message for e in events if e.kind == "note"] == result.notes and len(result.notes) == len(fields)


@pytest.mark.slow
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
    [text] = [e for e in events if e.kind == "load" and e.data["component"] == "text_encoder"]
    assert text.data["excluded_bytes"] == result.loads["text_encoder"]["excluded_bytes"] > 0
    assert "not read (ref2va never runs them)" in text.message
    resident: set[str] = set()
    for event in events:  # replay the residency events: transformer_ref is loaded into an empty process
        if event.kind == "load":
            assert event.data["component"] != "transformer_ref" or not resident, resident
            resident.add(event.data["component"])
        elif event.kind == "release":
            resident.discard(event.data["component"])
    held = [{c for c, w in r["components"].items() if w["mechanism"] != "released"} for r in result.residency]
    assert not any({"transformer", "transformer_ref"} <= h for h in held)
    assert {"transformer_ref"} in held  # alone while it denoises


@pytest.mark.slow
def test_ref2va_with_a_clip_and_an_image_equals_diffusers_own_pipeline_on_its_own_decode(
        h3_tiny: Path, keyframe: Path, clip: Path, tmp_path: Path):
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference, MiniMaxH3VideoReference

    events: list[PipelineEvent] = []
    result = run_generate(h3_tiny, replace(BASE, ref_image=str(keyframe), ref_video=str(clip)), tmp_path / "c.mp4",
                          device_info=UNIFIED, on_event=events.append)
    assert result.workflow == "ref2va"
    references = [MiniMaxH3ImageReference(image=_rgb(keyframe)), MiniMaxH3VideoReference.from_file(str(clip))]
    assert references[1].audio is not None and references[1].fps == 25.0
    assert result.video_sha256 == diffusers_digest(h3_tiny, "ref2va", references=references)
    alone = run_generate(h3_tiny, replace(BASE, ref_video=str(clip)), tmp_path / "d.mp4", device_info=UNIFIED)
    assert alone.video_sha256 == diffusers_digest(h3_tiny, "ref2va", references=references[1:])
    assert alone.video_sha256 != result.video_sha256
    described = result.inputs["ref_video"]
    assert described["file"] == "motion.mp4" and (described["frames"], described["fps"]) == (20, 25.0)
    assert "resampled from 25 to 24 fps" in described["note"] and described["note"] in result.notes
    assert [e.message for e in events if e.kind == "note"].count(described["note"]) == 1
    # The clip decodes in a stage of its own, first, so every later stage (prepare on) holds it alike.
    assert result.stages[:2] == ["read_clip", "prepare"] and result.stage_peaks["read_clip"] > 0


@pytest.mark.parametrize("workflow", ["t2va", "fl2va", "ref2va"])
def test_the_text_encoder_reads_only_what_its_workflow_runs_and_reports_the_rest(h3_tiny: Path, workflow: str):
    from models.checkpoint.components import load_component

    module, report = load_component(h3_tiny, "text_encoder", workflow=workflow, dtype=torch.bfloat16)
    skipped = set(report.excluded)
    layers = len(module.model.language_model.layers)
    assert layers == 51 and any(n.startswith("lm_head.") for n in skipped)
    assert any(n.startswith("model.language_model.layers.51.") for n in skipped)
    assert not any(n.startswith(f"model.language_model.layers.{i}.") for n in skipped for i in range(layers))
    vision = {n for n in skipped if n.startswith("model.visual.")}
    assert bool(vision) == (workflow == "t2va")  # fl2va and ref2va present their images (and clips) to it
    assert report.excluded_tensors == len(skipped) and report.excluded_bytes > 0
    loaded = list(module.model.visual.parameters())  # t2va's is a NotLoaded stand-in without parameters
    assert (not loaded) == (workflow == "t2va") and not any(t.is_meta for t in loaded)




@pytest.mark.slow
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


def test_the_two_dits_meet_only_in_a_block_that_reads_both():
    from models.run.workflows import plan_from_reads

    dits = {"transformer", "transformer_ref"}
    apart = {"encode": ("text_encoder",), "base": ("transformer",), "idle": (), "ref": ("transformer_ref",),
             "decode": ("vae",)}
    together = {**apart, "both": ("transformer", "transformer_ref")}
    together = {k: together[k] for k in ("encode", "base", "both", "ref", "decode")}
    assert not any(dits <= set(s.resident) for s in plan_from_reads(apart, sequential=True))
    plan = plan_from_reads(together, sequential=True)
    assert [s.block for s in plan if dits <= set(s.resident)] == ["both"]
    assert {s.block: s.releases for s in plan}["both"] == ("transformer",)  # ref's next block reads only its DiT


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


@pytest.mark.slow
def test_vae_tiling_off_is_recorded_warned_and_applied(h3_tiny: Path, tmp_path: Path):
    events: list[PipelineEvent] = []
    result = run_generate(h3_tiny, replace(BASE, steps=2, audio=False, vae_tiling=False), tmp_path / "c.mp4",
                          device_info=UNIFIED, on_event=events.append)
    assert result.vae_tiling is False and VAE_TILING_WARNING in result.notes
    assert any(e.kind == "note" and e.message == VAE_TILING_WARNING for e in events)


@pytest.mark.slow
def test_fp32_vae_decodes_in_the_checkpoint_s_precision(h3_tiny: Path, tmp_path: Path):
    bf16 = run_generate(h3_tiny, replace(BASE, steps=2, audio=False), tmp_path / "a.mp4", device_info=UNIFIED)
    fp32 = run_generate(h3_tiny, replace(BASE, steps=2, audio=False, vae_dtype="fp32"), tmp_path / "b.mp4",
                        device_info=UNIFIED)
    assert fp32.vae_dtype == "fp32" and fp32.loads["vae"]["bytes_placed"] > bf16.loads["vae"]["bytes_placed"]
    assert fp32.video_sha256 != bf16.video_sha256


FEW_STEP = {"scheduler": {"shift": 5.0, "num_inference_steps": 4}, "audio_scheduler": {"shift": 2.0}}
"""A distilled checkpoint's own scheduler configs: same classes, 4 steps, other shifts."""


@pytest.mark.slow
def test_a_few_step_checkpoint_runs_its_own_steps_and_shift(h3_tiny: Path, tmp_path: Path):
    from models.synth.writer import synth_h3
    from models.request.params import ModelSpec
    from models.synth.profiles import get_profile

    root = tmp_path / "distilled"
    synth_h3(root, get_profile("tiny"), seed=0, schedulers=FEW_STEP)
    spec = ModelSpec.read(root)
    assert (spec.default_steps, spec.shift) == (4, 5.0)
    assert (ModelSpec.read(h3_tiny).default_steps, ModelSpec.read(h3_tiny).shift) == (50, 12.0)
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


@pytest.mark.parametrize("field", ["image", "last_image", "ref_image"])
def test_every_input_image_beyond_4_to_1_is_refused_at_submit(h3_tiny: Path, tmp_path: Path, field):
    from models.request.params import ModelSpec, validate_params

    wide = tmp_path / "wide.png"
    Image.new("RGB", (260, 64)).save(wide)
    with pytest.raises(GenerateParamsError) as caught:
        validate_params(replace(BASE, **{field: str(wide)}), ModelSpec.read(h3_tiny))
    assert caught.value.problems == {field: f"{wide}: 260x64; MiniMax H3 takes images within 1:4 and 4:1"}
