import av
import pytest

from jobs.spec import JobSpecError, build_spec
from models.pipeline import STAGES
from storage.artifacts import job_dir
from storage.queries import artifacts, events, samples_since


def test_kind_generate_writes_an_mp4_artifact_and_records_every_stage(db, config, queue_job, run_to_end, tiny_model):
    job_id = queue_job("generate", model=str(tiny_model),
                       generate={"prompt": "a red fox", "frames": 9, "height": 32, "width": 48, "steps": 3, "fps": 8})
    job = run_to_end(job_id, timeout=120)
    assert job["status"] == "succeeded", job["error"]

    [video] = [a for a in artifacts(db, job_id) if a["media_type"] == "video/mp4"]
    path = job_dir(config.data_dir, job_id) / video["name"]
    assert video["media_type"] == "video/mp4" and video["name"] == "video.mp4"
    assert path.resolve().parent == job_dir(config.data_dir, job_id) and path.stat().st_size == video["size"] > 0
    with av.open(str(path)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 9
        assert container.streams.audio

    rows = events(db, job_id)
    started = [e["stage"] for e in rows if e["kind"] == "stage_start"]
    ended = [e["stage"] for e in rows if e["kind"] == "stage_end"]
    assert started == ended == ["probe", *STAGES]
    assert {"device", "load"} <= {e["kind"] for e in rows}
    assert (job["progress_done"], job["progress_total"]) == (3, 3)

    sample_stages = {s["stage"] for s in samples_since(db, job_id)}
    assert {"conditioning", "denoising", "decoding"} <= sample_stages

    metrics = job["metrics"]
    assert set(metrics["stage_seconds"]) == set(STAGES)
    assert metrics["stage_peaks"]["denoising"] > 0
    assert metrics["peak_footprint"] == max(metrics["stage_peaks"].values())
    assert set(metrics["loads"]) == {"text_encoder", "transformer", "vae", "audio_vae"}


@pytest.mark.parametrize(
    "params, field, message",
    [
        ({"prompt": "a fox", "frames": 10}, "generate.frames", "is not 1 + 4 * k"),
        ({"prompt": "a fox", "height": 40}, "generate.height", "multiple of 16"),
        ({"prompt": "a fox", "steps": 0}, "generate.steps", "outside 1..200"),
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
    with pytest.raises(JobSpecError, match="model: cannot read .*transformer/config.json"):
        build_spec({"kind": "generate", "model": str(config.model_roots[0] / "dummy.safetensors"),
                    "generate": {"prompt": "a fox"}}, config)
