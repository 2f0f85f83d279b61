"""Jobs on a full disk: the job ends failed saying so and where; the supervisor and the history carry on."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from jobs.queue import submit
from jobs.supervisor import Supervisor
from storage.artifacts import job_dir
from storage.config import load_config
from storage.schema import open_database
from storage.queries import get_job, list_jobs
from storage.schema import FINAL_STATUSES

TINY_CLIP = {"prompt": "a red fox", "frames": 124, "height": 64, "width": 64, "steps": 2}


def fill(folder: Path, leave: int = 0) -> None:
    """Take all but `leave` free bytes of `folder`'s filesystem, the way another writer would."""
    with open(folder / "filler", "wb") as f:
        f.write(b"\0" * (shutil.disk_usage(folder).free - leave))


@pytest.mark.slow
def test_a_generate_job_whose_artifact_disk_is_full_fails_saying_so_and_the_next_job_runs(
    db, config, queue_job, run_to_end, tiny_model, small_tmpfs
):
    earlier = run_to_end(queue_job("steps"))
    fill(small_tmpfs(64 * 1024, name="data/artifacts"))

    job_id = queue_job("generate", model=str(tiny_model), generate=TINY_CLIP)
    job = run_to_end(job_id, timeout=300)
    assert job["status"] == "failed" and job["exit_code"] == 3
    video = job_dir(config.data_dir, job_id) / "video.mp4"
    assert job["error"].startswith(f"DiskFullError: disk full while writing {video}: 0 bytes free")
    assert not video.exists()

    later = run_to_end(queue_job("steps"))
    assert later["status"] == "succeeded", later["error"]
    assert get_job(db, earlier["id"]) == earlier
    assert [j["status"] for j in list_jobs(db)][:3] == ["succeeded", "failed", "succeeded"]


def test_a_job_whose_database_disk_fills_up_ends_failed_naming_the_database_and_the_supervisor_keeps_going(
    config, monkeypatch, small_tmpfs, capsys
):
    disk = small_tmpfs(2 * 2**20, name="full")
    monkeypatch.setenv("DRAINBOARD_DATA", str(disk / "data"))
    monkeypatch.setenv("DRAINBOARD_MODEL_ROOTS", str(config.model_roots[0]))
    full = load_config()
    db = open_database(full.db_path)
    supervisor = Supervisor(full, grace=1.0)
    supervisor.start()
    model = str(config.model_roots[0] / "dummy.safetensors")

    def run(job_id: int, timeout: float = 60.0) -> dict:
        deadline = time.time() + timeout
        while get_job(db, job_id)["status"] not in FINAL_STATUSES:
            assert time.time() < deadline, f"job {job_id} did not end: {get_job(db, job_id)}"
            supervisor.tick()
            time.sleep(0.02)
        return get_job(db, job_id)

    try:
        earlier = run(submit(db, {"kind": "steps", "model": model}, full))
        monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "50000")
        job_id = submit(db, {"kind": "steps", "model": model}, full)
        fill(disk, leave=512 * 1024)  # room to claim the job and record its end, not for 50000 samples
        job = run(job_id)
        # The supervisor stores the samples it relays: it sees the full disk and stops the job.
        assert job["status"] == "failed" and job["exit_code"] != 0
        assert job["error"].startswith(f"disk full: cannot write to the database {full.db_path} (")
        assert "the job could not record its samples" in job["error"]
        assert capsys.readouterr().err.count("disk full, retrying") <= 1  # said once, not every tick
        assert get_job(db, earlier["id"]) == earlier and len(list_jobs(db)) == 2

        (disk / "filler").unlink()
        monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "5")
        assert run(submit(db, {"kind": "steps", "model": model}, full))["status"] == "succeeded"
    finally:
        supervisor.stop()
        db.conn.close()


def test_a_supervisor_on_a_full_disk_says_so_once_not_every_second(config, monkeypatch, small_tmpfs, capsys):
    disk = small_tmpfs(2 * 2**20, name="full")
    monkeypatch.setenv("DRAINBOARD_DATA", str(disk / "data"))
    monkeypatch.setenv("DRAINBOARD_MODEL_ROOTS", str(config.model_roots[0]))
    supervisor = Supervisor(load_config(), grace=1.0)
    supervisor.start()
    try:
        fill(disk)
        deadline = time.time() + 3.5
        while time.time() < deadline:  # three heartbeats fail; the ticks between them write nothing
            assert supervisor.tick() in (True, False)
            time.sleep(0.05)
        assert capsys.readouterr().err.count("disk full, retrying") == 1
    finally:
        (disk / "filler").unlink()
        supervisor.stop()
