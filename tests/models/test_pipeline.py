"""The generate pipeline on the tiny model: MP4 output, determinism, offload sites, validation."""

from __future__ import annotations

import re

from dataclasses import replace
from pathlib import Path

import av
import numpy as np
import pytest

from loader.device import DeviceInfo
from loader.offload import OffloadSettings
from models.params import GenerateParams, GenerateParamsError, ModelSpec, validate_params
from models.pipeline import STAGES, PipelineEvent, run_generate

SMALL = GenerateParams(prompt="a red fox in the snow", frames=9, height=48, width=64, steps=2, fps=12)
"""Nine frames of 64x48 in two steps: every stage runs, in well under a second each."""

DISCRETE = DeviceInfo("cpu", "cpu", None, "fake discrete GPU", False, 8 * 2**30, "test", "a discrete device for tests")
UNIFIED = DeviceInfo("cpu", "cpu", None, "fake unified GPU", True, 8 * 2**30, "test", "a unified device for tests")


def _frames(path: Path) -> np.ndarray:
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


@pytest.fixture(scope="module")
def small_clip(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """(result, events, samples) of one SMALL generate on the tiny model."""
    events: list[PipelineEvent] = []
    samples = []
    out = tmp_path_factory.mktemp("clips") / "clip.mp4"
    result = run_generate(tiny_model, SMALL, out, on_event=events.append,
                          on_sample=lambda stage, s: samples.append((stage, s)), sample_interval=0.01)
    return result, events, samples


def test_tiny_generate_writes_a_browser_playable_mp4_with_audio(small_clip):
    result, _, _ = small_clip
    with av.open(result.out_path) as c:
        video, audio = c.streams.video[0], c.streams.audio[0]
        assert (video.codec_context.name, video.codec_context.pix_fmt) == ("h264", "yuv420p")
        assert (video.codec_context.width, video.codec_context.height) == (64, 48)
        assert audio.codec_context.name == "aac"
        assert video.frames == 9
        assert float(video.duration * video.time_base) == pytest.approx(9 / 12, abs=1e-3)
        assert c.duration / 1e6 == pytest.approx(9 / 12, abs=0.05)
    assert Path(result.out_path).read_bytes()[4:8] == b"ftyp"
    assert b"moov" in Path(result.out_path).read_bytes()[:4096]  # faststart: index before the media data


def test_generate_reports_every_stage_in_order_with_seconds_peaks_and_samples(small_clip):
    result, events, samples = small_clip
    starts = [e.stage for e in events if e.kind == "stage_start"]
    assert starts == list(STAGES)
    assert [e.data["step"] for e in events if e.kind == "step"] == [1, 2]
    assert set(result.stage_seconds) == set(STAGES) == set(result.stage_peaks)
    assert all(peak > 0 for peak in result.stage_peaks.values())
    assert {stage for stage, _ in samples} == set(STAGES)


def test_same_seed_gives_identical_frames_and_another_seed_or_prompt_differs(tiny_model: Path, small_clip, tmp_path):
    result, _, _ = small_clip
    again = run_generate(tiny_model, SMALL, tmp_path / "again.mp4")
    other_seed = run_generate(tiny_model, replace(SMALL, seed=7), tmp_path / "seed.mp4")
    other_prompt = run_generate(tiny_model, replace(SMALL, prompt="a blue whale in the deep"), tmp_path / "prompt.mp4")
    assert again.frames_sha256 == result.frames_sha256
    assert len({result.frames_sha256, other_seed.frames_sha256, other_prompt.frames_sha256}) == 3
    first = _frames(Path(result.out_path)).astype(int)
    # The encoder is not bit-reproducible; the same frames still decode within a few levels.
    assert np.abs(first - _frames(Path(again.out_path))).mean() < 3
    assert np.abs(first - _frames(Path(other_seed.out_path))).mean() > 20
    assert np.abs(first - _frames(Path(other_prompt.out_path))).mean() > 5


def _moves(events: list[PipelineEvent]) -> list[tuple[str, str, str]]:
    return [(e.stage, e.data["component"], e.data["to"]) for e in events if e.kind == "move"]


def test_offload_on_a_discrete_device_moves_each_component_around_its_forward(tiny_model: Path, tmp_path: Path):
    events: list[PipelineEvent] = []
    settings = OffloadSettings(dit_layerwise_offload=False)
    result = run_generate(tiny_model, replace(SMALL, steps=1), tmp_path / "c.mp4", offload=settings,
                          device_info=DISCRETE, on_event=events.append)
    loads = {e.data["component"]: e.data["device"] for e in events if e.kind == "load"}
    assert loads == dict.fromkeys(("text_encoder", "transformer", "vae", "audio_vae"), "cpu")
    assert _moves(events) == [
        ("conditioning", "text_encoder", "cpu"), ("conditioning", "text_encoder", "cpu"),
        ("denoising", "transformer", "cpu"), ("denoising", "transformer", "cpu"),
        ("decoding", "vae", "cpu"), ("decoding", "vae", "cpu"),
        ("decoding", "audio_vae", "cpu"), ("decoding", "audio_vae", "cpu"),
    ]
    assert result.offload["dit_cpu_offload"] and result.decisions == []


def test_layerwise_offload_brings_each_block_in_and_out_per_step(tiny_model: Path, tmp_path: Path):
    events: list[PipelineEvent] = []
    run_generate(tiny_model, replace(SMALL, steps=2), tmp_path / "c.mp4", device_info=DISCRETE, on_event=events.append)
    denoise = [c for stage, c, _ in _moves(events) if stage == "denoising"]
    per_step = ["transformer.transformer_blocks.0"] * 2 + ["transformer.transformer_blocks.1"] * 2
    assert denoise == ["transformer (all but its blocks)"] + per_step * 2


def test_policy_for_unified_memory_never_moves_a_module_to_the_host(tiny_model: Path, tmp_path: Path):
    events: list[PipelineEvent] = []
    result = run_generate(tiny_model, SMALL, tmp_path / "c.mp4", device_info=UNIFIED, on_event=events.append)
    assert _moves(events) == []
    assert not any(result.offload[f] for f in ("dit_layerwise_offload", "dit_cpu_offload",
                                               "text_encoder_cpu_offload", "vae_cpu_offload"))
    assert {d["flag"] for d in result.decisions} >= {"dit_layerwise_offload", "vae_cpu_offload"}


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"frames": 10}, "frames", "10 is not 1 + 4 * k"),
        ({"height": 40}, "height", "40 is not a positive multiple of 16"),
        ({"width": 0}, "width", "0 is not a positive multiple of 16"),
        ({"prompt": "x" * 200}, "prompt", "202 tokens"),
        ({"prompt": "  "}, "prompt", "must not be empty"),
        ({"steps": 0}, "steps", "0 is outside 1..200"),
        ({"guidance_scale": 0.5}, "guidance_scale", "0.5 is outside 1.0..30.0"),
    ],
)
def test_bad_params_are_refused_naming_the_field(tiny_model: Path, change: dict, field: str, message: str):
    with pytest.raises(GenerateParamsError, match=re.escape(f"{field}: {message}")) as info:
        validate_params(replace(SMALL, **change), ModelSpec.read(tiny_model))
    assert list(info.value.problems) == [field]


def test_a_clip_that_would_not_fit_in_memory_is_refused(tiny_model: Path):
    with pytest.raises(GenerateParamsError, match=r"frames: .*need about .* GiB .* available"):
        validate_params(replace(SMALL, frames=121, height=720, width=1280), ModelSpec.read(tiny_model),
                        available_bytes=2**30)


def test_run_generate_refuses_bad_params_before_reading_weights(tiny_model: Path, tmp_path: Path):
    events: list[PipelineEvent] = []
    with pytest.raises(GenerateParamsError, match="frames"):
        run_generate(tiny_model, replace(SMALL, frames=8), tmp_path / "c.mp4", on_event=events.append)
    assert not any(e.kind == "load" for e in events) and not (tmp_path / "c.mp4").exists()


def test_generate_samples_through_the_callers_probe_so_cgroup_usage_is_recorded(tiny_model: Path, tmp_path: Path):
    from loader.memory import MemoryProbe

    usage = tmp_path / "memory.usage_in_bytes"  # stands in for the job's cgroup counter
    usage.write_text("123456789\n")
    samples = []
    with MemoryProbe(None, cgroup_file=str(usage)) as probe:
        run_generate(tiny_model, replace(SMALL, steps=1), tmp_path / "c.mp4", probe=probe,
                     on_sample=lambda stage, s: samples.append(s))
        assert probe.sample().cgroup_usage == 123456789  # still open: run_generate leaves the caller's probe alone
    assert samples and all(s.cgroup_usage == 123456789 for s in samples)
