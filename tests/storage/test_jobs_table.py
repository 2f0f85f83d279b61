"""`storage.jobs_table`'s transitions do what their names say (that it is the table's one writer:
tests/storage/test_table_owners.py)."""

from __future__ import annotations

import pytest

from storage import jobs_table
from storage.queries import get_job


def test_a_cancel_request_ends_a_queued_job_flags_a_running_one_and_leaves_a_finished_one(fresh_db):
    queued, running, done = (jobs_table.enqueue(fresh_db, "load", {}, now=1.0) for _ in range(3))
    jobs_table.start(fresh_db, running, supervisor_id="s", now=2.0)
    jobs_table.finish(fresh_db, done, "succeeded", now=3.0)
    assert [jobs_table.request_cancel(fresh_db, i, now=4.0) for i in (queued, running, done, 99)] == \
        ["queued", "running", "succeeded", None]
    assert get_job(fresh_db, queued)["status"] == "cancelled" and get_job(fresh_db, queued)["finished_at"] == 4.0
    assert get_job(fresh_db, running)["status"] == "running" and get_job(fresh_db, running)["cancel_requested"] == 1
    assert get_job(fresh_db, done)["status"] == "succeeded" and get_job(fresh_db, done)["cancel_requested"] == 0


def test_finish_merges_metrics_keeps_the_childs_error_and_ends_a_job_only_once(fresh_db):
    job = jobs_table.enqueue(fresh_db, "load", {"model": "/m"}, now=1.0)
    assert jobs_table.claim_oldest(fresh_db, "s", boot_id="b", now=2.0) == job
    assert jobs_table.claim_oldest(fresh_db, "s") is None
    jobs_table.set_metrics(fresh_db, job, {"bytes_placed": 5})
    jobs_table.set_error(fresh_db, job, "CheckpointError: bad", "detail")
    with pytest.raises(ValueError, match="'running' is not a final status"):
        jobs_table.finish(fresh_db, job, "running")
    assert jobs_table.finish(fresh_db, job, "failed", exit_code=1, metrics={"memory_limit": 7}, now=9.0)
    assert not jobs_table.finish(fresh_db, job, "succeeded")
    row = get_job(fresh_db, job)
    assert (row["status"], row["error"], row["error_detail"], row["exit_code"], row["finished_at"]) == \
        ("failed", "CheckpointError: bad", "detail", 1, 9.0)
    assert row["metrics"] == {"bytes_placed": 5, "memory_limit": 7}
    assert (row["started_at"], row["heartbeat_at"], row["supervisor_id"], row["boot_id"]) == (2.0, 2.0, "s", "b")


def test_a_stage_from_outside_never_hides_the_jobs_own(fresh_db):
    job = jobs_table.enqueue(fresh_db, "load", {})
    jobs_table.set_stage_unless_set(fresh_db, job, "waiting for Ray")
    assert get_job(fresh_db, job)["stage"] == "waiting for Ray"
    jobs_table.set_stage(fresh_db, job, "load")
    jobs_table.set_stage_unless_set(fresh_db, job, "waiting for Ray")
    assert get_job(fresh_db, job)["stage"] == "load"
