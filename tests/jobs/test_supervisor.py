import os
import signal
import subprocess
import sys
import time

import pytest

from jobs.presence import REPO_ROOT, supervisor_status
from jobs.queue import cancel
from jobs.supervisor import Supervisor
from storage.queries import artifacts, events, get_job, last_sample, sample_count


def test_a_job_that_succeeds_stores_metrics_samples_stages_and_its_log(db, queue_job, run_to_end):
    job = run_to_end(queue_job("steps"))
    assert job["status"] == "succeeded" and job["exit_code"] == 0 and job["error"] is None
    assert job["metrics"] == {"steps": 5}
    assert sample_count(db, job["id"]) == 5
    assert (job["progress_done"], job["progress_total"]) == (5, 5)
    assert [e["kind"] for e in events(db, job["id"])] == ["stage_start", "stage_end"]
    assert [a["name"] for a in artifacts(db, job["id"])] == ["child.log"]


@pytest.mark.slow
def test_a_job_that_raises_fails_with_its_message(db, queue_job, run_to_end):
    job = run_to_end(queue_job("fail"))
    assert job["status"] == "failed" and job["exit_code"] == 1
    assert job["error"] == "ValueError: blocks.3.weight: expected shape (4, 4), got (4, 5)"
    assert sample_count(db, job["id"]) == 1


@pytest.mark.slow
def test_a_job_killed_with_sigkill_is_reported_with_oom_wording_and_its_last_sample(
    db, queue_job, run_to_end, tick_until, monkeypatch
):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "400")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.02")
    victim = queue_job("steps")
    tick_until(lambda: sample_count(db, victim) >= 20)
    os.kill(get_job(db, victim)["pid"], signal.SIGKILL)
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "3")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0")
    survivor = queue_job("steps")
    job = run_to_end(victim)
    assert job["status"] == "killed" and job["signal"] == "SIGKILL"
    last = last_sample(db, victim)
    assert "killed (SIGKILL), most likely by the kernel OOM killer" in job["error"]
    assert f"stage load, tensor {last['tensors_placed']} of 400 (blocks.{last['tensors_placed']}.weight)" in job["error"]
    assert "VmRSS" in job["error"] and "MemAvailable" in job["error"]
    assert run_to_end(survivor)["status"] == "succeeded"


def test_cancelling_a_queued_job_means_it_never_runs(db, queue_job, supervisor):
    job_id = queue_job("steps")
    assert cancel(db, job_id) == "cancelled"
    assert supervisor.tick() is False
    job = get_job(db, job_id)
    assert job["status"] == "cancelled" and job["started_at"] is None


def test_cancelling_a_running_job_stops_it_and_keeps_its_samples(db, queue_job, run_to_end, tick_until, monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "10000")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.01")
    job_id = queue_job("steps")
    tick_until(lambda: sample_count(db, job_id) >= 5)
    assert cancel(db, job_id) == "running"
    job = run_to_end(job_id, timeout=20)
    assert job["status"] == "cancelled"
    assert job["error"].startswith("cancelled while running")
    assert sample_count(db, job_id) == last_sample(db, job_id)["seq"] + 1 >= 5


@pytest.mark.slow
def test_a_child_ignoring_sigterm_is_killed_after_the_grace_period(
    db, supervisor, queue_job, tick_until, run_to_end, monkeypatch
):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "10000")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.01")
    supervisor.grace = 0.5
    job_id = queue_job("steps")
    tick_until(lambda: sample_count(db, job_id) >= 1)
    os.kill(get_job(db, job_id)["pid"], signal.SIGSTOP)  # a hung child: SIGTERM cannot act
    cancel(db, job_id)
    start = time.time()
    job = run_to_end(job_id, timeout=20)
    assert job["status"] == "cancelled" and job["signal"] == "SIGKILL"
    assert time.time() - start >= 0.5


@pytest.mark.slow
def test_a_supervisor_killed_mid_job_leaves_the_job_interrupted_after_restart(db, config, queue_job, monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "10000")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.01")
    job_id = queue_job("steps")
    worker = subprocess.Popen([sys.executable, "-m", "jobs", "worker"], cwd=REPO_ROOT, env=dict(os.environ))
    try:
        deadline = time.time() + 60
        while sample_count(db, job_id) < 3:
            assert time.time() < deadline, "the worker never started the job"
            time.sleep(0.05)
        child_pid = get_job(db, job_id)["pid"]
        worker.kill()
        worker.wait()
    finally:
        if worker.poll() is None:
            worker.kill()
    assert get_job(db, job_id)["status"] == "running"
    restarted = Supervisor(config)
    assert restarted.start() == [job_id]
    job = get_job(db, job_id)
    assert job["status"] == "interrupted" and "supervisor" in job["error"]
    deadline = time.time() + 5
    while os.path.exists(f"/proc/{child_pid}") and time.time() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child_pid}"), "the orphaned job child is still running"
    restarted.stop()


def test_supervisor_status_follows_the_heartbeat(db, config):
    assert supervisor_status(db)["alive"] is False
    supervisor = Supervisor(config)
    supervisor.start(now=1000.0)
    assert supervisor_status(db, now=1005.0)["alive"] is True
    assert supervisor_status(db, now=1011.0)["alive"] is False
    supervisor.tick(now=1011.0)
    assert supervisor_status(db, now=1012.0)["pid"] == os.getpid()
    supervisor.stop()
    assert supervisor_status(db, now=1012.0)["alive"] is False


@pytest.mark.slow
def test_a_forked_child_starts_with_the_import_time_objects_frozen_and_a_spawned_one_without(
    db, config, queue_job, run_to_end
):
    forked = run_to_end(queue_job("collector"))
    assert forked["status"] == "succeeded"
    assert forked["metrics"]["frozen_objects"] > 50_000  # torch alone leaves more than that
    spawning = Supervisor(config, grace=1.0, start_method="spawn")
    spawning.start()
    try:
        job_id = queue_job("collector")
        deadline = time.time() + 60
        while get_job(db, job_id)["status"] != "succeeded" and time.time() < deadline:
            spawning.tick()
            time.sleep(0.02)
    finally:
        spawning.stop()
    assert get_job(db, job_id)["metrics"] == {"frozen_objects": 0}
