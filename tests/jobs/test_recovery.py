"""No job stays running forever: dead supervisors, zombies, host restarts, leaked cgroups, partial files."""

import os
import signal
import subprocess
import sys
import time

import pytest

from jobs.cgroups import memory_limit_support, own_memory_group
from jobs.liveness import pid_alive
from jobs.presence import REPO_ROOT, ensure_supervisor, supervisor_status
from jobs.queue import cancel, retry
from jobs.supervisor import Supervisor
from storage import jobs_table
from storage.artifacts import job_dir
from storage.queries import artifacts, get_job, last_sample, sample_count
from storage.sample_writer import append_samples, sample_row


def start_worker() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "jobs", "worker"], cwd=REPO_ROOT, env=dict(os.environ))


def wait_for(condition, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"{what} not reached in time"
        time.sleep(0.05)


def test_a_zombie_counts_as_dead():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", what="zombie")
    assert not pid_alive(child.pid) and pid_alive(os.getpid())
    child.wait()
    assert not pid_alive(child.pid)


@pytest.mark.slow
def test_a_live_supervisor_recovers_the_job_of_another_that_was_sigkilled_mid_job(db, config, queue_job, monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "100000")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.01")
    survivor = Supervisor(config, grace=1.0)
    survivor.start()
    worker = start_worker()
    try:
        job_id = queue_job("steps")
        wait_for(lambda: sample_count(db, job_id) >= 3, what="the worker's job's samples")  # the survivor idles
        child_pid = get_job(db, job_id)["pid"]
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        assert get_job(db, job_id)["status"] == "running"
        monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "3")
        monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0")
        wait_for(lambda: survivor.tick() is not None and get_job(db, job_id)["status"] != "running", 20,
                 what="recovery by the live supervisor")  # no restart needed
        job = get_job(db, job_id)
        assert job["status"] == "interrupted"
        assert f"its supervisor ({job['supervisor_id']}) stopped while the job was running" in job["error"]
        last = last_sample(db, job_id)
        assert f"tensor {last['tensors_placed']} of 100000" in job["error"]
        wait_for(lambda: not pid_alive(child_pid), 5, what="the orphaned child's death")
        retried = retry(db, job_id, config)  # cancel and retry work again on a job that ended
        wait_for(lambda: survivor.tick() is not None and get_job(db, retried)["status"] == "succeeded", 60,
                 what="the retried job")
    finally:
        if worker.poll() is None:
            worker.kill()
        survivor.stop()


def test_a_job_whose_supervisor_stopped_heartbeating_is_recovered_after_the_stale_time(db, config, queue_job):
    job_id = queue_job("steps")
    hung = Supervisor(config)
    hung.start(now=1000.0)
    jobs_table.start(db, job_id, supervisor_id=hung.id, now=1000.0)
    other = Supervisor(config)
    other.start(now=1005.0)
    assert other.recover_interrupted(now=1005.0) == []  # a heartbeat 5 s old: still tended
    assert cancel(db, job_id) == "running"
    hung._heartbeat(1011.0)  # alive, but no longer tending its job (whose heartbeat stopped at 1000)
    assert other.recover_interrupted(now=1011.0) == [job_id]
    job = get_job(db, job_id)
    assert job["status"] == "interrupted"
    assert f"its supervisor ({hung.id}) stopped tending the job (no heartbeat for 11 s)" in job["error"]
    with pytest.raises(Exception, match="already interrupted"):
        cancel(db, job_id)
    other.stop()
    hung.stop()


@pytest.mark.slow
def test_a_job_running_when_the_host_restarted_ends_interrupted_saying_so_with_its_last_sample(
    db, config, queue_job, run_to_end, monkeypatch
):
    monkeypatch.setenv("DRAINBOARD_BOOT_ID", "boot-1")
    finished = run_to_end(queue_job("steps"))
    job_id = queue_job("steps")
    before = Supervisor(config)
    before.start()
    jobs_table.start(db, job_id, supervisor_id=before.id, boot_id="boot-1")
    append_samples(db, job_id, 0, [sample_row(job_id=job_id, seq=0, rank=0, t=4.2, stage="load", tensors_placed=31,
                                              tensor_name="blocks.31.weight", vm_rss=2**30, mem_available=3 * 2**30)])
    jobs_table.set_progress(db, job_id, 31, 48)
    monkeypatch.setenv("DRAINBOARD_BOOT_ID", "boot-2")  # the host came back; the old heartbeat is fresh
    after = Supervisor(config)
    assert after.start() == [job_id]
    job = get_job(db, job_id)
    assert job["status"] == "interrupted"
    assert job["error"] == ("interrupted: the host restarted while this job ran; last sample at 4.2 s: stage load, "
                            "tensor 31 of 48 (blocks.31.weight), VmRSS 1.00 GiB, MemAvailable 3.00 GiB")
    assert get_job(db, finished["id"])["status"] == "succeeded"
    assert supervisor_status(db)["id"] == after.id  # the row of the old boot does not count as alive
    after.stop()


@pytest.mark.slow
def test_the_spawned_supervisor_is_detached_so_it_never_becomes_our_zombie(config, db):
    status = ensure_supervisor(config, wait=90)  # a loaded 2-core box takes a while to import torch
    pid = status["launched_pid"]
    try:
        assert status["alive"] and status["pid"] == pid, open(config.data_dir / "worker.log").read()
        parent = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        assert parent != os.getpid()
        assert os.getsid(pid) == pid
    finally:
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not pid_alive(pid), 20, what="the worker's exit")
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # not our child: nothing of it is left for us to reap
    assert supervisor_status(db)["alive"] is False


@pytest.mark.slow
def test_a_killed_encode_leaves_no_partial_video(db, config, queue_job, tick_until, run_to_end, monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "10000")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.01")
    job_id = queue_job("encode")
    video = job_dir(config.data_dir, job_id) / "video.mp4"
    tick_until(lambda: video.exists() and video.stat().st_size >= 48 * 3)
    os.kill(get_job(db, job_id)["pid"], signal.SIGKILL)
    job = run_to_end(job_id)
    assert job["status"] == "killed" and "stage encoding" in job["error"]
    assert not video.exists()
    assert [a["name"] for a in artifacts(db, job_id)] == ["child.log"]
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "3")
    done = run_to_end(queue_job("encode"))
    assert [a["name"] for a in artifacts(db, done["id"])] == ["video.mp4", "child.log"]


@pytest.mark.slow
def test_a_multi_problem_error_is_one_line_for_lists_with_the_full_text_beside_it(queue_job, run_to_end):
    job = run_to_end(queue_job("broken_checkpoint"))
    assert job["status"] == "failed"
    assert job["error"] == ("CheckpointError: 3 problems: shard-0.safetensors: truncated, expected 4096 bytes "
                            "(+2 more)")
    assert job["error_detail"].splitlines()[1:] == [
        f"  shard-{i}.safetensors: truncated, expected 4096 bytes" for i in range(3)]


needs_cgroup = pytest.mark.skipif(memory_limit_support() is not None, reason=f"{memory_limit_support()}")


@needs_cgroup
def test_stale_job_cgroups_are_swept_and_a_live_supervisors_are_kept(config):
    parent = own_memory_group()[1]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = parent / f"drainboard-job-999-{dead.pid}"
    live = parent / f"drainboard-job-998-{os.getpid()}"
    stale.mkdir()
    live.mkdir()
    try:
        supervisor = Supervisor(config)
        supervisor.start()
        assert not stale.exists() and live.exists()
        supervisor.stop()
    finally:
        for group in (stale, live):
            if group.exists():
                group.rmdir()


@pytest.mark.slow
@needs_cgroup
def test_the_cgroup_of_a_job_whose_supervisor_was_sigkilled_is_removed_by_the_next(db, config, queue_job, monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "100000")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.01")
    job_id = queue_job("steps", memory_limit="512MiB")
    worker = start_worker()
    try:
        wait_for(lambda: sample_count(db, job_id) >= 3, what="samples")
        group = own_memory_group()[1] / f"drainboard-job-{job_id}-{worker.pid}"
        assert group.is_dir()
        worker.kill()
        worker.wait()
    finally:
        if worker.poll() is None:
            worker.kill()
    supervisor = Supervisor(config)
    assert supervisor.start() == [job_id]
    assert not group.exists()
    supervisor.stop()


@pytest.mark.slow
@needs_cgroup
def test_a_sigkill_from_outside_a_limited_job_is_not_blamed_on_the_oom_killer(db, queue_job, tick_until, run_to_end,
                                                                              monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "100000")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.01")
    job_id = queue_job("steps", memory_limit="512MiB")
    tick_until(lambda: sample_count(db, job_id) >= 3)
    os.kill(get_job(db, job_id)["pid"], signal.SIGKILL)
    job = run_to_end(job_id)
    assert job["status"] == "killed" and job["metrics"]["cgroup_oom_kills"] == 0
    assert job["error"].startswith("killed by SIGKILL from outside the job (its memory cgroup, limit 512.0 MiB, "
                                   "counted no OOM kill); last sample at ")
    assert "OOM killer" not in job["error"]
