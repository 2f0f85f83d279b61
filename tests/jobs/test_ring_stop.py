"""A cancel and a memory-guard stop that land during a ring load on io_uring: the child ends by itself,
in the state each asks for, within 2 s, with its last sample kept (before the queue consumed only the
completions posted, a SIGTERM during a wait could spin the child until the SIGKILL)."""

import os
import time

import pytest

from jobs.guard import GUARD_GRACE
from jobs.queue import cancel
from storage.queries import events, last_sample, sample_count


@pytest.fixture
def ring_file(tmp_path, monkeypatch):
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(8 << 20))
    monkeypatch.setenv("DRAINBOARD_TEST_FILE", str(path))
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "100000")
    return path


def _ended_by_itself(job: dict) -> bool:
    return job["signal"] == "SIGTERM"  # JobCancelled, samples flushed, then the SIGTERM it got: no SIGKILL


def test_a_cancel_during_a_ring_load_ends_cancelled_within_two_seconds(db, ring_file, queue_job, tick_until, run_to_end):
    job_id = queue_job("ring_load")
    tick_until(lambda: sample_count(db, job_id) >= 5)
    start = time.monotonic()
    assert cancel(db, job_id) == "running"
    job = run_to_end(job_id, timeout=20)
    assert time.monotonic() - start < 2.0
    assert job["status"] == "cancelled" and _ended_by_itself(job), job
    last = last_sample(db, job_id)
    assert sample_count(db, job_id) == last["seq"] + 1 and last["tensors_placed"] >= 4


def test_a_memory_guard_stop_during_a_ring_load_ends_in_the_guards_state_within_two_seconds(
    db, ring_file, queue_job, run_to_end, monkeypatch
):
    monkeypatch.setenv("DRAINBOARD_TEST_MIB", "8")
    job = run_to_end(queue_job("ring_load", memory_budget="96MiB"), timeout=90)
    assert job["status"] == "killed" and job["error"].startswith("memory guard: system in use grew "), job["error"]
    assert GUARD_GRACE <= 2.0 and _ended_by_itself(job), job  # no SIGKILL: it ended within the guard's grace
    assert len([e for e in events(db, job["id"]) if e["kind"] == "memory_guard"]) == 1
    last = last_sample(db, job["id"])
    assert sample_count(db, job["id"]) == last["seq"] + 1 and 0 < last["tensors_placed"] < 100000
