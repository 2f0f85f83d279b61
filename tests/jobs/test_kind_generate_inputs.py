"""fl2va generate jobs: the image is checked at submit, copied into the job's folder in the queueing
transaction, read from there by the child; a bad image queues nothing."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from jobs.queue import retry, submit
from jobs.spec import JobSpecError
from storage.artifacts import job_dir
from storage.queries import artifacts, events, list_jobs


@pytest.fixture
def frame(tmp_path):
    path = tmp_path / "user" / "frame.jpg"
    path.parent.mkdir()
    Image.fromarray((np.random.RandomState(1).rand(48, 80, 3) * 255).astype(np.uint8)).save(path, "JPEG")
    return path


@pytest.mark.slow
def test_an_fl2va_job_runs_from_its_own_copy_of_the_image(db, config, run_to_end, tiny_model, frame):
    job_id = submit(db, {"kind": "generate", "model": str(tiny_model),
                         "generate": {"prompt": "a red fox", "frames": 124, "height": 64, "width": 64, "steps": 2,
                                      "audio": False, "image": str(frame)}}, config)
    copy = job_dir(config.data_dir, job_id) / "image.jpg"
    assert copy.read_bytes() == frame.read_bytes()
    frame.unlink()  # the child must not need the user's file
    job = run_to_end(job_id, timeout=300)
    assert job["status"] == "succeeded", job["error"]
    media = {a["name"]: a["media_type"] for a in artifacts(db, job_id)}
    assert (media["image.jpg"], media["video.mp4"]) == ("image/jpeg", "video/mp4")
    metrics = job["metrics"]
    assert metrics["workflow"] == "fl2va" and metrics["inputs"]["image"]["file"] == "image.jpg"
    assert "80x48 is stretched onto the 64x64 canvas" in metrics["inputs"]["image"]["note"]
    assert metrics["vae_tiling"] is True
    assert any(e["kind"] == "note" and "80x48" in e["message"] for e in events(db, job_id))
    again = retry(db, job_id, config)  # the user's file is gone: the retry takes the first job's copy
    assert (job_dir(config.data_dir, again) / "image.jpg").read_bytes() == copy.read_bytes()


def test_a_truncated_image_is_refused_at_submit_and_nothing_is_queued(db, config, tiny_model, frame):
    frame.write_bytes(frame.read_bytes()[:200])
    with pytest.raises(JobSpecError) as caught:
        submit(db, {"kind": "generate", "model": str(tiny_model),
                    "generate": {"prompt": "a fox", "image": str(frame)}}, config)
    assert "generate.image" in str(caught.value) and "truncated or corrupt" in str(caught.value)
    assert list_jobs(db) == [] and not (config.data_dir / "artifacts").exists()


def test_a_ref2va_job_runs_from_its_own_copy_of_the_clip(db, config, run_to_end, tiny_model, tmp_path):
    from models.video.encode import write_mp4

    clip = tmp_path / "user" / "motion.mov"
    clip.parent.mkdir(exist_ok=True)
    write_mp4(clip, (np.random.RandomState(4).rand(16, 48, 80, 3) * 255).astype(np.uint8), 24)
    job_id = submit(db, {"kind": "generate", "model": str(tiny_model),
                         "generate": {"prompt": "a red fox", "frames": 124, "height": 64, "width": 64, "steps": 2,
                                      "audio": False, "ref_video": str(clip)}}, config)
    copy = job_dir(config.data_dir, job_id) / "ref_video.mp4"
    assert copy.read_bytes() == clip.read_bytes()
    clip.unlink()  # the child must not need the user's file
    job = run_to_end(job_id, timeout=300)
    assert job["status"] == "succeeded", job["error"]
    assert {a["name"]: a["media_type"] for a in artifacts(db, job_id)}["ref_video.mp4"] == "video/mp4"
    metrics = job["metrics"]
    assert metrics["workflow"] == "ref2va" and "transformer_ref" in metrics["loads"]
    assert metrics["inputs"]["ref_video"]["file"] == "ref_video.mp4" and metrics["inputs"]["ref_video"]["frames"] == 16
    # The clip decodes in a stage of its own, sampled: a kill there names it, not the probe before it.
    assert metrics["stages"][:2] == ["read_clip", "prepare"]
    sampled = {row["stage"] for row in db.query("SELECT DISTINCT stage FROM samples WHERE job_id = ?", [job_id])}
    assert "read_clip" in sampled
    again = retry(db, job_id, config)  # the user's file is gone: the retry takes the first job's copy
    assert (job_dir(config.data_dir, again) / "ref_video.mp4").read_bytes() == copy.read_bytes()
