"""A job ended by a signal is told by who sent it: its fork server stopping, or a signal from outside the
job (neither a cancel nor the memory guard), never the OOM killer or a stray line of its log."""

from __future__ import annotations

import os
import signal

import pytest

from jobs.supervisor import Supervisor
from storage.queries import get_job, sample_count
from storage.schema import FINAL_STATUSES


@pytest.fixture
def slow_steps(monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "100000")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.01")


def _started(db, supervisor, tick_until, queue_job) -> int:
    job_id = queue_job("steps")
    tick_until(lambda: sample_count(db, job_id) >= 3)
    return job_id


@pytest.fixture
def sigint_heard():
    """SIGINT as a terminal delivers it: a shell starting these tests in the background (without job control) has
    them ignore it, and the fork server, like any process, would inherit that."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_fork_server_is_named_and_the_next_job_gets_another(
        sigint_heard, db, supervisor, queue_job, tick_until, run_to_end, slow_steps, monkeypatch, sig):
    job_id = _started(db, supervisor, tick_until, queue_job)
    os.kill(supervisor._fork_server.process.pid, sig)
    job = run_to_end(job_id)
    assert job["status"] == "interrupted", job["error"]
    assert job["error"].startswith(f"interrupted: its fork server stopped ({sig.name}), and the job with it; "
                                   f"last sample at"), job["error"]
    assert "OOM" not in job["error"]
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "3")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0")
    assert run_to_end(queue_job("steps"))["status"] == "succeeded"


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_sigterm_from_outside_is_named_not_a_failure_with_a_line_of_the_log(
        config, db, queue_job, slow_steps, start_method):
    sup = Supervisor(config, grace=1.0, start_method=start_method)
    sup.start()
    try:
        job_id = queue_job("steps")
        while sample_count(db, job_id) < 3:
            sup.tick()
        os.kill(get_job(db, job_id)["pid"], signal.SIGTERM)
        while get_job(db, job_id)["status"] not in FINAL_STATUSES:
            sup.tick()
    finally:
        sup.stop()
    job = get_job(db, job_id)
    assert (job["status"], job["signal"]) == ("killed", "SIGTERM"), job["error"]
    assert job["error"].startswith("terminated by a signal from outside the job (SIGTERM); last sample at"), job["error"]


def test_a_cancel_still_says_cancelled_with_its_signal(db, queue_job, tick_until, run_to_end, slow_steps):
    from jobs.queue import cancel

    job_id = queue_job("steps")
    tick_until(lambda: sample_count(db, job_id) >= 3)
    cancel(db, job_id)
    job = run_to_end(job_id)
    assert (job["status"], job["error"]) == ("cancelled", "cancelled while running (SIGTERM)")
