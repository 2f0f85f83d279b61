"""Another process holding the database's write lock past the busy timeout stops nothing and loses nothing:
the worker, its sample relay and a job child wait it out, the wait is said while it lasts (the notice the
System page reads) and in the job once it ends. The busy timeouts are shortened so a lock of a few seconds
outlasts them."""

from __future__ import annotations

import time

import pytest

from jobs.presence import supervisor_status
from jobs.reporting import DatabaseReporter
from machine.memory import MemorySample
from storage import connections, jobs_table
from storage.lock_waits import lock_notice_path, read_lock_notice
from storage.queries import events, get_job, sample_count
from storage.sample_writer import SampleWriter


@pytest.fixture
def short_busy_timeouts(monkeypatch):
    monkeypatch.setattr(connections, "BUSY_TIMEOUT_MS", 200)
    monkeypatch.setattr(connections, "RETRY_AFTER_MS", 200)


def test_a_lock_held_past_the_busy_timeout_pauses_the_worker_and_its_job_loses_nothing(
    short_busy_timeouts, db, config, queue_job, supervisor, run_to_end, hold_write_lock, monkeypatch
):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "40")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.05")
    job_id = queue_job("steps")
    deadline = time.time() + 60
    while sample_count(db, job_id) < 3:  # the job is running and storing samples
        assert time.time() < deadline
        supervisor.tick()
        time.sleep(0.02)
    holder = hold_write_lock(config.db_path, 3.0)
    job = run_to_end(job_id)  # the ticks wait out the lock: not one raises
    assert holder.stdout.readline().strip() == "notice"  # said while it lasted
    assert job["status"] == "succeeded", job["error"]
    assert sample_count(db, job_id) == 40 and job["metrics"] == {"steps": 40}
    locked = [e for e in events(db, job_id) if e["kind"] == "database_locked"]
    assert len(locked) == 1
    assert locked[0]["message"].startswith("the job database was locked by another process for ")
    assert locked[0]["message"].endswith("this worker's writes waited and none was lost")
    spell = locked[0]["data"]
    assert 2.0 < spell["until"] - spell["since"] < 10.0
    assert not lock_notice_path(config.db_path).exists()
    assert supervisor_status(db)["alive"]


def test_the_sample_flusher_outlives_a_lock_and_stores_every_sample(
    db, config, hold_write_lock, short_busy_timeouts
):
    job_id = jobs_table.enqueue(db, "load", {}, now=0.0)
    writer = SampleWriter(config.db_path, job_id, t0=0.0, flush_interval=0.05)
    holder = hold_write_lock(config.db_path, 1.5)
    for i in range(5):
        writer.add(MemorySample(t=float(i), vm_rss=i, rss_anon=i, rss_file=0, vm_hwm=i, mem_available=10**9))
    holder.wait()
    deadline = time.time() + 10
    while sample_count(db, job_id) < 5:  # the background flush stores them: no add, flush or close needed
        assert time.time() < deadline, "the sample flusher stopped"
        time.sleep(0.05)
    writer.close()


def test_a_job_childs_write_waits_out_a_lock(db, config, hold_write_lock, short_busy_timeouts):
    job_id = jobs_table.enqueue(db, "load", {}, now=0.0)
    reporter = DatabaseReporter(job_id, config.db_path, config.data_dir)
    hold_write_lock(config.db_path, 1.0)
    reporter.stage("load")
    reporter.close()
    assert get_job(db, job_id)["stage"] == "load"


def test_a_supervisor_waiting_for_the_lock_is_alive_to_the_dashboard(db, config, supervisor, monkeypatch):
    from jobs import presence

    monkeypatch.setattr(presence, "STALE_AFTER", 0.0)  # its heartbeat row is stale: it could not be written
    assert not supervisor_status(db)["alive"]
    supervisor.lock_wait.refused(time.time())  # what its first refused write does
    assert read_lock_notice(config.db_path).owner == supervisor.id
    assert supervisor_status(db)["alive"]


def test_a_job_whose_worker_waits_for_the_lock_is_not_taken_for_dead(db, config, monkeypatch):
    """`jobs list`, `jobs show` and other workers end the jobs of dead supervisors: a worker waiting out a lock
    has a stale heartbeat row and a stale job heartbeat, and must not look dead (its child would be killed)."""
    from jobs import presence, recovery
    from jobs.supervisor import Supervisor

    supervisor = Supervisor(config)  # not started: no fork server to stop
    job_id = jobs_table.enqueue(db, "load", {}, now=0.0)
    jobs_table.start(db, job_id, supervisor_id=supervisor.id, boot_id=supervisor.boot_id, now=time.time() - 60)
    monkeypatch.setattr(presence, "STALE_AFTER", 0.0)
    monkeypatch.setattr(recovery, "STALE_AFTER", 0.0)
    now = time.time()
    assert [job["id"] for job, _ in recovery.orphans(db, now, boot=supervisor.boot_id)] == [job_id]
    supervisor.lock_wait.refused(now)
    assert recovery.orphans(db, now, boot=supervisor.boot_id) == []
    supervisor.db.conn.close()
