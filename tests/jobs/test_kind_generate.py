import av
import numpy as np
import pytest

from jobs.spec import JobSpecError, build_spec
from storage.artifacts import job_dir
from storage.queries import artifacts, events, samples_since


BLOCKS = ["text_encoder", "denoise.no_keyframe_anchors", "denoise.prepare_layout", "denoise.prepare_latents",
          "denoise.set_timesteps", "denoise.denoise", "denoise.after_denoise", "decode.video", "decode.audio"]


@pytest.mark.slow
def test_kind_generate_writes_an_h264_stereo_aac_mp4_and_records_stages_steps_loads_and_releases(
        db, config, queue_job, run_to_end, tiny_model):
    """On the CPU the policy is the unified one: every flag off, sequential residency."""
    job_id = queue_job("generate", model=str(tiny_model),
                       generate={"prompt": "a red fox", "frames": 124, "height": 64, "width": 64, "steps": 3})
    job = run_to_end(job_id, timeout=300)
    assert job["status"] == "succeeded", job["error"]

    [video] = [a for a in artifacts(db, job_id) if a["media_type"] == "video/mp4"]
    path = job_dir(config.data_dir, job_id) / video["name"]
    assert video["name"] == "video.mp4" and path.stat().st_size == video["size"] > 0
    with av.open(str(path)) as container:
        v, a = container.streams.video[0], container.streams.audio[0]
        assert (v.codec_context.name, v.codec_context.pix_fmt, v.average_rate) == ("h264", "yuv420p", 24)
        assert (a.codec_context.name, a.codec_context.layout.name, a.rate, a.channels) == ("aac", "stereo", 32000, 2)
        assert sum(1 for _ in container.decode(video=0)) == 124
    with av.open(str(path)) as container:
        pcm = np.concatenate([f.to_ndarray() for f in container.decode(audio=0)], axis=1)
        assert pcm.shape[0] == 2 and pcm.shape[1] >= 5 * 32000 and np.abs(pcm).max() > 0

    rows = events(db, job_id)
    started = [e["stage"] for e in rows if e["kind"] == "stage_start"]
    assert started == [e["stage"] for e in rows if e["kind"] == "stage_end"]
    assert started == ["probe", "prepare", "load.text_encoder", "text_encoder", *BLOCKS[1:5], "load.transformer",
                       "denoise.denoise", "denoise.after_denoise", "load.vae", "decode.video", "load.audio_vae",
                       "decode.audio", "encode"]
    assert [e["data"]["component"] for e in rows if e["kind"] == "load"] == [
        "text_encoder", "transformer", "vae", "audio_vae"]
    assert [e["data"]["component"] for e in rows if e["kind"] == "release"] == [
        "text_encoder", "transformer", "vae", "audio_vae"]
    assert {e["data"]["mechanism"] for e in rows if e["kind"] == "placement"} == {"on device"}
    assert len([e for e in rows if e["kind"] == "decision"]) == 5
    assert (job["progress_done"], job["progress_total"]) == (2, 2)  # 3 steps: 2 DiT calls

    sample_stages = {s["stage"] for s in samples_since(db, job_id)}
    assert {"load.transformer", "denoise.denoise", "decode.video"} <= sample_stages

    metrics = job["metrics"]
    assert metrics["stages"] == started[1:] and set(metrics["stage_seconds"]) == set(started[1:])
    assert metrics["stage_peaks"]["denoise.denoise"] > 0
    assert metrics["peak_footprint"] == max(metrics["stage_peaks"].values())
    assert set(metrics["loads"]) == {"text_encoder", "transformer", "vae", "audio_vae"}
    assert metrics["loads"]["text_encoder"]["excluded_tensors"] > 0  # lm_head, vision tower: never read
    assert metrics["sequential_components"] is True and metrics["video_sha256"]


@pytest.mark.parametrize(
    "params, field, message",
    [
        ({"prompt": "a fox", "frames": 10}, "generate.frames", "is not 17n + 5 within 5-15 s at 24 fps"),
        ({"prompt": "a fox", "height": 40, "width": 64}, "generate.height", "multiple of 32"),
        ({"prompt": "a fox", "steps": 1}, "generate.steps", "outside 2..1000"),
        ({"prompt": "a fox", "guidance_scale": 4.0}, "generate.guidance_scale", "guidance-distilled"),
        ({"prompt": "   "}, "generate.prompt", "must not be empty"),
        ({"prompt": "a fox", "frames": "many"}, "generate.frames", "must be an integer"),
        ({"prompt": "a fox", "audio": "yes"}, "generate.audio", "true or false"),
        ({"prompt": "a fox", "colour": "red"}, "generate.colour", "unknown parameter"),
    ],
)
def test_generate_params_the_model_cannot_take_are_refused_before_queueing(config, tiny_model, params, field, message):
    with pytest.raises(JobSpecError) as caught:
        build_spec({"kind": "generate", "model": str(tiny_model), "generate": params}, config)
    assert caught.value.field == field
    assert message in str(caught.value)


def test_a_generate_job_on_a_checkpoint_that_is_no_generate_model_is_refused(config):
    with pytest.raises(JobSpecError, match="model: dummy.safetensors: a single file of an unknown model"):
        build_spec({"kind": "generate", "model": str(config.model_roots[0] / "dummy.safetensors"),
                    "generate": {"prompt": "a fox"}}, config)


def test_a_few_step_checkpoint_s_job_runs_the_steps_its_scheduler_config_names(db, config, queue_job, run_to_end):
    """A distilled checkpoint (same classes, its own scheduler config): steps unset take its 4, not H3's 50."""
    from models.synth.writer import synth_h3
    from models.synth.profiles import get_profile

    root = config.model_roots[0] / "distilled"
    synth_h3(root, get_profile("tiny"), seed=0, schedulers={"scheduler": {"shift": 5.0, "num_inference_steps": 4}})
    job_id = queue_job("generate", model=str(root),
                       generate={"prompt": "a red fox", "frames": 124, "height": 64, "width": 64, "audio": False})
    job = run_to_end(job_id, timeout=300)
    assert job["status"] == "succeeded", job["error"]
    assert job["metrics"]["num_inference_steps"] == 4 and job["metrics"]["steps"] == 3
    assert (job["progress_done"], job["progress_total"]) == (3, 3)  # 4 steps: 3 DiT calls
