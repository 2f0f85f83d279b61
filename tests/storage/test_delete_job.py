"""delete_job removes a finished job and everything it left, and refuses one that may still run."""

from __future__ import annotations

import pytest

from storage.artifacts import job_dir, new_artifact_path, record_artifact
from storage.events_table import add_event
from storage.queries import delete_job, get_job, sample_count
from storage.sample_writer import SampleWriter


def _finished_job_with_everything(db, db_path, data_dir, add_job, memory_sample) -> int:
    job_id = add_job(db, status="succeeded")
    with SampleWriter(db_path, job_id, t0=0.0) as writer:
        for i in range(40):
            writer.add(memory_sample(i), stage="load", tensors_placed=i, bytes_placed=i * 10, tensor_name=f"w{i}")
    add_event(db, job_id, "stage_start", "load", created_at=0)
    video = new_artifact_path(data_dir, job_id, "video", ".mp4")
    video.write_bytes(b"x" * 5000)
    log = new_artifact_path(data_dir, job_id, "child", ".log")
    log.write_bytes(b"y" * 300)
    record_artifact(db, data_dir, job_id, video)
    record_artifact(db, data_dir, job_id, log)
    return job_id


def test_a_finished_job_goes_with_its_samples_events_artifacts_and_folder(fresh_db, db_path, tmp_path, add_job, memory_sample):
    data_dir = tmp_path / "data"
    job_id = _finished_job_with_everything(fresh_db, db_path, data_dir, add_job, memory_sample)
    keep = _finished_job_with_everything(fresh_db, db_path, data_dir, add_job, memory_sample)
    retry = add_job(fresh_db, status="queued", retry_of=job_id)

    assert delete_job(fresh_db, data_dir, job_id) == 5300
    assert get_job(fresh_db, job_id) is None
    assert sample_count(fresh_db, job_id) == 0
    for table in ("sample_extremes", "events", "artifacts"):
        assert fresh_db.execute(f"SELECT count(*) FROM {table} WHERE job_id = ?", [job_id]).fetchone()[0] == 0
    assert not job_dir(data_dir, job_id).exists()
    # The other job is untouched; the retry stays, without its link.
    assert sample_count(fresh_db, keep) == 40 and job_dir(data_dir, keep).exists()
    assert get_job(fresh_db, retry)["retry_of"] is None


@pytest.mark.parametrize("status", ["queued", "running"])
def test_a_job_that_may_still_run_is_refused_and_kept(fresh_db, tmp_path, add_job, status):
    job_id = add_job(fresh_db, status=status)
    with pytest.raises(ValueError, match=f"job {job_id} is {status}: only a finished job can be deleted"):
        delete_job(fresh_db, tmp_path, job_id)
    assert get_job(fresh_db, job_id)["status"] == status


def test_an_unknown_job_is_named(fresh_db, tmp_path):
    with pytest.raises(ValueError, match="there is no job 12"):
        delete_job(fresh_db, tmp_path, 12)
