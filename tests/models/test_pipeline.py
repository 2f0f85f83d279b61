"""Generate on the tiny H3 checkpoint: the seed contract against diffusers' own pipeline, stages, offload, MP4."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from machine.device import DeviceInfo
from machine.offload import OffloadSettings
from models.request.params import GenerateParams, GenerateParamsError
from models.run.pipeline import run_generate
from models.run.results import PipelineEvent
from models.run.state import ENCODE, PREPARE, load_stage
from models.run.residency import GROUP_OFFLOAD, MODEL_OFFLOAD, ON_DEVICE, RELEASED

SMALL = GenerateParams(prompt="a red fox in the snow", frames=124, height=64, width=64, steps=3, seed=7)
"""The shortest clip H3 takes (124 frames, 5.2 s) on a 64x64 canvas in two DiT calls."""

DISCRETE = DeviceInfo(spec="cpu", kind="cpu", index=None, name="fake discrete GPU", unified_memory=False,
                      total_memory=8 * 2**30, source="test", reason="a discrete device for tests")
UNIFIED = DeviceInfo(spec="cpu", kind="cpu", index=None, name="fake unified GPU", unified_memory=True,
                     total_memory=8 * 2**30, source="test", reason="a unified device for tests")
NO_OFFLOAD = OffloadSettings(dit_layerwise_offload=False, dit_cpu_offload=False, text_encoder_cpu_offload=False,
                             image_encoder_cpu_offload=False, vae_cpu_offload=False)
BLOCKS = ["text_encoder", "denoise.no_keyframe_anchors", "denoise.prepare_layout", "denoise.prepare_latents",
          "denoise.set_timesteps", "denoise.denoise", "denoise.after_denoise", "decode.video", "decode.audio"]
"""diffusers' t2va workflow, flattened."""


def video_digest(videos) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(videos)[0], dtype=np.float32).tobytes()).hexdigest()


@pytest.fixture(scope="module")
def diffusers_reference(h3_tiny: Path) -> str:
    """The digest of the frames diffusers' own loading and pipeline give for SMALL in bfloat16."""
    from diffusers import ModularPipeline

    from models.checkpoint.components import load_aux

    pipe = ModularPipeline.from_pretrained(str(h3_tiny), workflow="t2va")
    pipe.load_components(dtype=torch.bfloat16)
    if pipe.processor is None:  # Qwen3VLProcessor's video part needs torchvision, which this box lacks
        pipe.update_components(processor=load_aux(h3_tiny, "processor"))
    state = pipe(prompt=SMALL.prompt, num_frames=SMALL.frames, height=SMALL.height, width=SMALL.width,
                 num_inference_steps=SMALL.steps, generator=torch.Generator("cpu").manual_seed(SMALL.seed),
                 output_type="np")
    return video_digest(state.get("videos"))


@pytest.fixture(scope="module")
def small_clip(h3_tiny: Path, tmp_path_factory: pytest.TempPathFactory):
    """(result, events, samples) of SMALL on a fake discrete GPU with every offload flag requested, sequential."""
    events: list[PipelineEvent] = []
    samples = []
    out = tmp_path_factory.mktemp("clips") / "clip.mp4"
    result = run_generate(h3_tiny, SMALL, out, device_info=DISCRETE, sequential_components=True,
                          on_event=events.append, on_sample=lambda stage, s: samples.append((stage, s)),
                          sample_interval=0.01)
    return result, events, samples


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stream", "drain", "retain"])
def test_seed_contract_frames_equal_diffusers_own_pipeline_in_every_placement_mode(
        h3_tiny: Path, diffusers_reference: str, mode: str, tmp_path: Path):
    result = run_generate(h3_tiny, SMALL, tmp_path / "clip.mp4", dtype=torch.bfloat16, mode=mode,
                          device_info=UNIFIED)
    assert result.video_sha256 == diffusers_reference


@pytest.mark.slow
def test_offload_and_sequential_residency_change_nothing_in_the_frames(small_clip, diffusers_reference: str):
    result, _, _ = small_clip
    assert result.offload["dit_layerwise_offload"] and result.sequential_components
    assert result.video_sha256 == diffusers_reference


@pytest.mark.slow
def test_another_seed_or_prompt_gives_other_frames(h3_tiny: Path, small_clip, tmp_path: Path):
    result, _, _ = small_clip
    seed = run_generate(h3_tiny, replace(SMALL, seed=8), tmp_path / "a.mp4", device_info=UNIFIED)
    prompt = run_generate(h3_tiny, replace(SMALL, prompt="a whale at dusk"), tmp_path / "b.mp4",
                          device_info=UNIFIED)
    assert len({result.video_sha256, seed.video_sha256, prompt.video_sha256}) == 3


def test_the_mp4_is_h264_yuv420p_at_24_fps_with_stereo_aac_at_32_khz_and_faststart(small_clip):
    result, _, _ = small_clip
    with av.open(result.out_path) as c:
        video, audio = c.streams.video[0], c.streams.audio[0]
        assert (video.codec_context.name, video.codec_context.pix_fmt) == ("h264", "yuv420p")
        assert (video.codec_context.width, video.codec_context.height) == (64, 64)
        assert video.average_rate == 24
        assert sum(1 for _ in c.decode(video=0)) == 124
    with av.open(result.out_path) as c:
        audio = c.streams.audio[0]
        assert (audio.codec_context.name, audio.codec_context.layout.name, audio.rate) == ("aac", "stereo", 32000)
        decoded = np.concatenate([f.to_ndarray() for f in c.decode(audio=0)], axis=1)
        assert decoded.shape[0] == 2 and decoded.shape[1] >= 5 * 32000
    data = Path(result.out_path).read_bytes()
    assert data[4:8] == b"ftyp" and b"moov" in data[:4096]  # faststart: the index before the media data


def test_every_block_is_a_stage_loads_come_just_before_first_use_and_releases_after_last(small_clip):
    result, events, samples = small_clip
    starts = [e.stage for e in events if e.kind == "stage_start"]
    assert starts == [PREPARE, load_stage("text_encoder"), "text_encoder", *BLOCKS[1:5],
                      load_stage("transformer"), "denoise.denoise", "denoise.after_denoise",
                      load_stage("vae"), "decode.video", load_stage("audio_vae"), "decode.audio", ENCODE]
    assert starts == [e.stage for e in events if e.kind == "stage_end"] == result.stages
    assert [e.data["step"] for e in events if e.kind == "step"] == [1, 2]  # 3 steps, 2 DiT calls
    assert all(e.stage == "denoise.denoise" for e in events if e.kind == "step")
    released = [(e.stage, e.data["component"]) for e in events if e.kind == "release"]
    assert released == [("text_encoder", "text_encoder"), ("denoise.denoise", "transformer"),
                        ("decode.video", "vae"), ("decode.audio", "audio_vae")]
    assert set(result.stage_peaks) == set(starts) and all(v > 0 for v in result.stage_peaks.values())
    assert {stage for stage, _ in samples} == set(starts)
    assert set(result.loads) == {"text_encoder", "transformer", "vae", "audio_vae"}


def test_each_release_trims_the_heap_so_the_component_s_small_tensors_leave_the_resident_set(
        h3_tiny: Path, tmp_path: Path, monkeypatch):
    """Sequential residency hands the heap's free pages back after every release (a trim the run used to skip:
    the demo's released text encoder then stayed resident, or not, by the order of frees)."""
    import models.run.state as run_state

    trims = []
    trim = run_state.give_back_free_heap
    monkeypatch.setattr(run_state, "give_back_free_heap", lambda: trims.append(1) or trim())
    events: list[PipelineEvent] = []
    run_generate(h3_tiny, SMALL, tmp_path / "clip.mp4", device_info=UNIFIED, on_event=events.append)
    assert len(trims) == sum(e.kind == "release" for e in events) == 4


def test_sequential_residency_holds_only_the_running_block_s_component(small_clip):
    result, _, _ = small_clip
    held = {r["block"]: {c for c, w in r["components"].items() if w["mechanism"] != RELEASED}
            for r in result.residency}
    assert held["text_encoder"] == {"text_encoder"}
    assert held["denoise.prepare_layout"] == set()
    assert held["denoise.denoise"] == {"transformer"}
    assert held["decode.video"] == {"vae"} and held["decode.audio"] == {"audio_vae"}


def _where(result, block: str, component: str) -> dict:
    [row] = [r for r in result.residency if r["block"] == block]
    return row["components"][component]


@pytest.mark.parametrize(
    "flag, component, block, mechanism, hook",
    [
        ("dit_layerwise_offload", "transformer", "denoise.denoise", GROUP_OFFLOAD, "diffusers group offload"),
        ("dit_cpu_offload", "transformer", "denoise.denoise", MODEL_OFFLOAD, "accelerate cpu offload"),
        ("text_encoder_cpu_offload", "text_encoder", "text_encoder", MODEL_OFFLOAD, "accelerate cpu offload"),
        ("vae_cpu_offload", "vae", "decode.video", MODEL_OFFLOAD, "accelerate cpu offload"),
        ("vae_cpu_offload", "audio_vae", "decode.audio", MODEL_OFFLOAD, "accelerate cpu offload"),
    ],
)
@pytest.mark.slow
def test_each_offload_flag_alone_puts_its_component_under_its_diffusers_mechanism(
        h3_tiny: Path, tmp_path: Path, flag, component, block, mechanism, hook):
    params = replace(SMALL, steps=2, audio=component == "audio_vae")
    result = run_generate(h3_tiny, params, tmp_path / "c.mp4", device_info=DISCRETE,
                          offload=replace(NO_OFFLOAD, **{flag: True}), sequential_components=False)
    assert result.placements[component]["mechanism"] == mechanism
    assert result.placements[component]["flag"] == flag and result.placements[component]["load_device"] == "cpu"
    where = _where(result, block, component)
    assert where["mechanism"] == mechanism and where["hooks"] == [hook]
    offloaded = {"vae", "audio_vae"} & set(result.loads) if flag == "vae_cpu_offload" else {component}
    assert {c for c, p in result.placements.items() if p["mechanism"] != ON_DEVICE} == offloaded


@pytest.mark.slow
@pytest.mark.parametrize("sequential", [True, False])
def test_a_model_offloaded_component_goes_back_to_the_host_only_when_it_stays_loaded(
        h3_tiny: Path, tmp_path: Path, monkeypatch, sequential: bool):
    """Sequential residency drops the text encoder where it ran: moving it back to the host first would
    allocate its full size on the host again only to free it."""
    from models.run.residency import Residency

    offloaded = []
    original = Residency.offload

    def offload(self) -> None:
        if self.placement.mechanism == MODEL_OFFLOAD:
            offloaded.append(self.placement.component)
        original(self)

    monkeypatch.setattr(Residency, "offload", offload)
    params = replace(SMALL, steps=2, audio=False)
    result = run_generate(h3_tiny, params, tmp_path / "c.mp4", device_info=DISCRETE,
                          offload=replace(NO_OFFLOAD, text_encoder_cpu_offload=True), sequential_components=sequential)
    assert result.placements["text_encoder"]["mechanism"] == MODEL_OFFLOAD
    assert set(offloaded) == (set() if sequential else {"text_encoder"})
    assert _where(result, "denoise.denoise", "text_encoder")["mechanism"] == (RELEASED if sequential else MODEL_OFFLOAD)


@pytest.mark.slow
def test_on_unified_memory_every_component_sits_on_the_device_with_no_hook_and_is_released(
        h3_tiny: Path, tmp_path: Path):
    result = run_generate(h3_tiny, replace(SMALL, steps=2, audio=False), tmp_path / "c.mp4", device_info=UNIFIED)
    assert {d["flag"] for d in result.decisions} == {"dit_layerwise_offload", "dit_cpu_offload",
                                                     "text_encoder_cpu_offload", "image_encoder_cpu_offload",
                                                     "vae_cpu_offload"}
    assert {p["mechanism"] for p in result.placements.values()} == {ON_DEVICE}
    assert result.sequential_components  # the default on unified memory
    assert all(not w["hooks"] for r in result.residency for w in r["components"].values())


@pytest.mark.slow
def test_without_sequential_residency_every_component_stays_loaded_through_the_run(h3_tiny: Path, tmp_path: Path):
    events: list[PipelineEvent] = []
    result = run_generate(h3_tiny, replace(SMALL, steps=2, audio=False), tmp_path / "c.mp4", device_info=DISCRETE,
                          offload=NO_OFFLOAD, on_event=events.append)
    assert not result.sequential_components and not any(e.kind == "release" for e in events)
    assert result.stages[:4] == [PREPARE, *(load_stage(c) for c in ("text_encoder", "transformer", "vae"))]
    assert all(w["mechanism"] == ON_DEVICE for r in result.residency for w in r["components"].values())


@pytest.mark.slow
def test_no_audio_skips_the_audio_decoder_and_writes_video_only(h3_tiny: Path, tmp_path: Path):
    result = run_generate(h3_tiny, replace(SMALL, steps=2, audio=False), tmp_path / "c.mp4", device_info=UNIFIED)
    assert "decode.audio" not in result.stages and "audio_vae" not in result.loads
    with av.open(result.out_path) as c:
        assert not c.streams.audio


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"frames": 130}, "frames", "130 is not 17n + 5 within 5-15 s at 24 fps (124..345, e.g. 124, 141 or 345)"),
        ({"frames": 107}, "frames", "107 is not 17n + 5"),
        ({"frames": 362}, "frames", "(124..345"),
        ({"width": 100, "height": 64}, "width", "100 is not a positive multiple of 32"),
        ({"height": 64, "width": None}, "width", "give width and height together"),
        ({"steps": 1}, "steps", "1 is outside 2..1000 (N steps make N - 1 DiT calls)"),
        ({"guidance_scale": 4.0}, "guidance_scale", "guidance-distilled"),
        ({"negative_prompt": "blurry"}, "negative_prompt", "takes no negative prompt"),
        ({"fps": 30}, "fps", "generates at 24 fps only"),
        ({"prompt": "  "}, "prompt", "must not be empty"),
        ({"seed": -1}, "seed", "outside 0..2**63-1"),
    ],
)
def test_bad_params_are_refused_before_any_weight_is_read_naming_field_and_rule(
        h3_tiny: Path, tmp_path: Path, change: dict, field: str, message: str):
    events: list[PipelineEvent] = []
    with pytest.raises(GenerateParamsError) as caught:
        run_generate(h3_tiny, replace(SMALL, **change), tmp_path / "c.mp4", device_info=UNIFIED,
                     on_event=events.append)
    assert message in caught.value.problems[field]
    assert not events and not (tmp_path / "c.mp4").exists()


def test_unset_geometry_takes_the_checkpoint_s_own_16_by_9_canvas(h3_tiny: Path, tmp_path: Path):
    import json
    import shutil

    from models.request.params import ModelSpec

    root = tmp_path / "tiny"
    shutil.copytree(h3_tiny, root)
    index = json.loads((root / "modular_model_index.json").read_text())
    index.pop("canvas_short_edge", None), index.pop("canvas_max_pixels", None)
    (root / "modular_model_index.json").write_text(json.dumps(index))
    spec = ModelSpec.read(root)
    assert spec.canvas_multiple == 32 and spec.frames_per_chunk == 17 and spec.latents_per_chunk == 5
    assert spec.geometry(GenerateParams(prompt="x")) == (768, 1344)  # the blocks' defaults: H3's release canvas
    (root / "modular_model_index.json").write_text(json.dumps({**index, "canvas_short_edge": 64,
                                                               "canvas_max_pixels": 8192}))
    assert ModelSpec.read(root).geometry(GenerateParams(prompt="x")) == (64, 128)
    assert spec.frame_counts()[0] == 124 and spec.frame_counts()[-1] == 345


def test_the_pipeline_constants_are_diffusers_own(h3_tiny: Path):
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MiniMaxH3ModularPipeline

    from models.request import params, video_length

    pipe = MiniMaxH3ModularPipeline()
    assert (pipe.fps, pipe.min_duration, pipe.max_duration, pipe.text_encoder_layer) == (
        video_length.FPS, video_length.MIN_SECONDS, video_length.MAX_SECONDS, params.TEXT_ENCODER_LAYER)


def test_generate_samples_through_the_callers_probe_so_cgroup_usage_is_recorded(h3_tiny: Path, tmp_path: Path):
    from machine.memory import MemoryProbe

    usage = tmp_path / "memory.usage_in_bytes"  # stands in for the job's cgroup counter
    usage.write_text("123456789\n")
    samples = []
    with MemoryProbe(None, cgroup_file=str(usage)) as probe:
        run_generate(h3_tiny, replace(SMALL, steps=2, audio=False), tmp_path / "c.mp4", probe=probe,
                     device_info=UNIFIED,
                     on_sample=lambda stage, s: samples.append(s))
        assert probe.sample().cgroup_usage == 123456789  # still open: run_generate leaves the caller's probe alone
    assert samples and all(s.cgroup_usage == 123456789 for s in samples)


def test_the_forecast_counts_exactly_the_bytes_the_loader_places_and_sequential_lowers_the_peak(
        h3_tiny: Path, small_clip):
    from models.forecast import forecast_generate

    result, _, _ = small_clip
    both = {seq: forecast_generate(h3_tiny, SMALL, device_info=DISCRETE, settings=OffloadSettings(),
                                   sequential_components=seq) for seq in (True, False)}
    assert both[True].component_bytes == {c: r["bytes_placed"] for c, r in result.loads.items()}
    assert [s.stage for s in both[True].stages] == ["text_encoder", "denoise.denoise", "decode.video", "decode.audio"]
    for seq, forecast in both.items():
        held = {s.stage: s.weight_bytes for s in forecast.stages}
        expected = sum(forecast.component_bytes.values())
        assert held["denoise.denoise"] == (forecast.component_bytes["transformer"] if seq else expected)
    assert both[True].predicted_peak_bytes < both[False].predicted_peak_bytes
    assert both[True].placements == {c: p["mechanism"] for c, p in result.placements.items()}
    assert both[True].to_dict()["predicted_peak_bytes"] == both[True].predicted_peak_bytes


def test_a_reference_clip_decodes_in_a_stage_of_its_own_with_its_samples(h3_tiny: Path, tmp_path: Path):
    """diffusers' decode of the clip (frames and whole soundtrack) runs in `read_clip`, sampled like any stage, so
    a kill while it runs names it (it once ran stage-less, read as "in stage probe")."""
    from machine.memory import MemoryProbe
    from models.inputs.clips import READ_CLIP
    from models.request.params import ModelSpec
    from models.run.pipeline import _read_clip
    from models.run.results import GenerateResult
    from models.run.state import RunState
    from tests.models.test_clips import float_soundtrack_clip

    path = float_soundtrack_clip(tmp_path / "motion.mov", 1.0)
    params = replace(SMALL, workflow="ref2va", ref_video=str(path))
    events, sampled = [], []
    result = GenerateResult(str(tmp_path / "c.mp4"), 124, 24, 124 / 24, 64, 64, True)
    probe = MemoryProbe(None)
    run = RunState(h3_tiny, None, torch.device("cpu"), torch.bfloat16, "stream", OffloadSettings(), {}, True,
                   events.append, lambda stage, sample: sampled.append(stage), 0.001, result, probe)
    try:
        reference = _read_clip(run, params, ModelSpec.read(h3_tiny))
    finally:
        probe.close()
    assert reference.frames.shape == (20, 48, 80, 3) and tuple(reference.audio.shape) == (2, 32000)
    assert result.stages == [READ_CLIP] and result.stage_peaks[READ_CLIP] > 0 and set(sampled) == {READ_CLIP}
    assert [(e.kind, e.stage) for e in events if e.kind.startswith("stage")] == [
        ("stage_start", READ_CLIP), ("stage_end", READ_CLIP)]
    assert result.inputs["ref_video"]["file"] == "motion.mov" and result.inputs["ref_video"]["audio"]
    from jobs.stage_words import stage

    assert stage(READ_CLIP) == "decoding the reference clip"  # what a page says while it runs


_HELD_AFTER_READ_CLIP = """
import json, sys
import av, torch
from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3VideoReference  # imported before the measurement
from loader.process import configure_process
from machine.memory import MemoryProbe
from machine.offload import OffloadSettings
from models.request.params import GenerateParams, ModelSpec
from models.run.pipeline import _read_clip
from models.run.results import GenerateResult
from models.run.state import RunState
configure_process()  # as every entry point does
root, clip = sys.argv[1], sys.argv[2]
params = GenerateParams(prompt="p", frames=124, height=64, width=64, steps=3, workflow="ref2va", ref_video=clip)
result = GenerateResult("c.mp4", 124, 24, 124 / 24, 64, 64, True)
probe = MemoryProbe(None)
run = RunState(root, None, torch.device("cpu"), torch.bfloat16, "stream", OffloadSettings(), {}, True, None, None,
               0.01, result, probe)
before = probe.sample().vm_rss
reference = _read_clip(run, params, ModelSpec.read(root))
print(json.dumps({"held": probe.sample().vm_rss - before, "frames": reference.frames.nbytes}))
"""


@pytest.mark.slow
def test_the_clip_s_frame_list_is_given_back_once_diffusers_has_stacked_it(h3_tiny: Path, tmp_path: Path):
    """640x400 frames are heap chunks under the 1 MiB mmap threshold: without a trim after the decode, the list
    diffusers stacks them from stayed resident beside the stack (twice the frames, in a fresh process) for the
    whole run."""
    import json
    import subprocess
    import sys

    from models.video.encode import write_mp4

    path = tmp_path / "wide.mp4"
    write_mp4(path, (np.random.RandomState(1).rand(100, 400, 640, 3) * 255).astype(np.uint8), 24, None, 32000)
    run = subprocess.run([sys.executable, "-c", _HELD_AFTER_READ_CLIP, str(h3_tiny), str(path)], capture_output=True,
                         text=True, check=True, timeout=300)
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    # 76.8 MB of frames: measured 1.3x held with the trim (PyAV's own buffers besides), 2.3x without
    assert measured["held"] < 1.6 * measured["frames"], measured


def test_a_released_component_goes_through_update_components_as_a_stand_in_that_says_so():
    """Sequential residency hands diffusers a meta shell (the blocks read its config) or, for a component without
    one, a stand-in that names the release when called, through the same public call as every other component."""
    import types

    import torch.nn as nn

    from models.checkpoint.components import NotLoaded
    from models.run.state import RunState

    handed: dict[str, nn.Module] = {}
    pipe = types.SimpleNamespace(update_components=lambda **components: handed.update(components))
    run = RunState(Path("."), pipe, torch.device("cpu"), torch.bfloat16, "stream", NO_OFFLOAD, {}, True, None, None,
                   0.1, None, None)
    shell = nn.Linear(2, 2, device="meta")
    run.shells = {"vae": shell}
    for name in ("text_encoder", "vae"):
        run.resident[name] = types.SimpleNamespace(module=nn.Linear(2, 2))
        run.done_with(name)
    assert handed["vae"] is shell and isinstance(handed["text_encoder"], NotLoaded) and run.resident == {}
    with pytest.raises(RuntimeError, match="text_encoder was not loaded: released after its last block"):
        handed["text_encoder"]()
