"""The worker outlives a deleted job folder, stops when its data folder is gone, and a launched one ends when idle."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from jobs.presence import REPO_ROOT
from storage.artifacts import job_dir
from storage.queries import events, get_job, sample_count


def test_a_running_jobs_folder_deleted_is_said_and_the_next_job_runs(db, config, queue_job, run_to_end, tick_until,
                                                                       monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "40")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.02")
    first, second = queue_job("steps"), queue_job("steps")
    tick_until(lambda: sample_count(db, first) >= 1)
    shutil.rmtree(job_dir(config.data_dir, first))
    job = run_to_end(first)
    assert job["status"] == "succeeded"
    warnings = [e["message"] for e in events(db, first) if e["kind"] == "warning"]
    assert warnings == [f"the job's artifact folder {job_dir(config.data_dir, first)} was deleted while it ran: "
                        f"its log and outputs are gone"]
    assert run_to_end(second)["status"] == "succeeded"  # the worker went on


def test_a_failed_jobs_error_says_its_folder_went_missing(db, config, queue_job, run_to_end, tick_until, monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "40")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.02")
    job_id = queue_job("steps")
    tick_until(lambda: sample_count(db, job_id) >= 1)
    shutil.rmtree(job_dir(config.data_dir, job_id))
    os.kill(get_job(db, job_id)["pid"], 9)
    job = run_to_end(job_id)
    assert job["status"] == "killed" and job["error"].endswith("was deleted while it ran: its log and outputs are gone")


def _worker(config, *argv: str) -> tuple[subprocess.Popen, str]:
    log = config.data_dir.parent / "worker.log"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "jobs", "worker", *argv], cwd=REPO_ROOT, env=env,
                                   stdout=out, stderr=subprocess.STDOUT)
    return process, str(log)


def _fork_server(process: subprocess.Popen, timeout: float = 60.0) -> psutil.Process:
    deadline = time.time() + timeout
    while time.time() < deadline:
        children = psutil.Process(process.pid).children()
        if children:
            return children[0]
        time.sleep(0.1)
    raise AssertionError("the worker started no fork server")


def _gone(proc: psutil.Process, timeout: float = 10.0) -> bool:
    try:
        proc.wait(timeout)
    except psutil.TimeoutExpired:
        return False
    return True


@pytest.mark.slow
def test_a_worker_whose_data_folder_is_deleted_exits_with_its_fork_server(config, db):
    process, log = _worker(config)
    try:
        server = _fork_server(process)
        time.sleep(1.5)
        shutil.rmtree(config.data_dir)
        assert process.wait(30) == 2
        assert _gone(server)
        text = open(log).read()
        assert f"the job database {config.db_path} is gone (its data folder was deleted); this worker stops" in text
    finally:
        process.kill()


@pytest.mark.slow
def test_a_worker_started_to_exit_when_idle_stays_while_a_page_is_open_then_exits(config, db):
    process, log = _worker(config, "--exit-when-idle", "2")
    try:
        server = _fork_server(process)
        for _ in range(25):  # 5 s of an open dashboard page: more than the idle time
            config.dashboard_heartbeat.touch()
            time.sleep(0.2)
            assert process.poll() is None
        assert process.wait(30) == 0
        assert _gone(server)
        assert "idle for 2 s (no job queued or running, no dashboard page open)" in open(log).read()
    finally:
        process.kill()


@pytest.mark.slow
def test_a_worker_started_on_someones_behalf_is_told_to_exit_when_idle(config, db):
    from jobs.presence import LAUNCHED_IDLE_EXIT, ensure_supervisor

    worker = psutil.Process(ensure_supervisor(config)["launched_pid"])
    try:
        assert worker.cmdline()[-3:] == ["worker", "--exit-when-idle", f"{LAUNCHED_IDLE_EXIT:g}"]
    finally:
        worker.terminate()
        assert _gone(worker, 30)
