"""A child stopped with SIGSTOP keeps a fresh heartbeat; the Job page calls it stalled from its last sample's age."""

from __future__ import annotations

import os
import signal
import time

import pandas as pd

from dashboard.views import jobs as jv
from storage.queries import events, get_job, sample_count, samples_since


def _view(db, job_id: int) -> tuple[dict, jv.LiveStats, pd.DataFrame]:
    job = get_job(db, job_id)
    stats = jv.live_stats(pd.DataFrame(samples_since(db, job_id)), None)
    frame = pd.DataFrame(events(db, job_id), columns=["id", "job_id", "t", "created_at", "kind", "stage", "message", "data"])
    return job, stats, frame


def test_a_stopped_child_is_stalled_from_its_last_samples_age(db, supervisor, queue_job, tick_until, monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "100000")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.01")
    job_id = queue_job("steps")
    tick_until(lambda: sample_count(db, job_id) >= 5)
    job, stats, frame = _view(db, job_id)
    assert jv.stalled_for(job, stats, frame) is None  # samples arrive: not stalled
    pid = job["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(0.5)  # samples already in the pipe land
        stopped_at = time.time()
        while time.time() < stopped_at + 2.0:  # the supervisor keeps tending it meanwhile
            supervisor.tick()
            time.sleep(0.1)
        job, stats, frame = _view(db, job_id)
        assert job["status"] == "running" and time.time() - job["heartbeat_at"] < 2  # the heartbeat says nothing
        age = jv.stalled_for(job, stats, frame, now=stopped_at + 2.0 + jv.STALL_AFTER)
        assert age is not None and age >= jv.STALL_AFTER + 2.0
        label = jv.status_label(job, stats, None, stalled=age)
        assert label.endswith(f"stalled: no progress for {age:.0f} s")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGCONT)
