"""Ending the jobs of a dead supervisor: whoever looks first (a starting or ticking supervisor, `jobs list`,
`jobs show`) marks them `interrupted`, so no view keeps calling a job "running" that nothing runs.

A running job is orphaned when its host restarted under it, its supervisor's row
is no longer alive (`jobs.presence.is_alive`: stopped, stale heartbeat, pid gone
or a zombie), or its own heartbeat is older than `STALE_AFTER`. What is left of
it is killed (only when the pid is still the child that was started), its cgroup
removed and its partial files deleted (its logs kept).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import sqlite_utils

from jobs.cgroups import sweep_job_cgroups
from jobs.ending import keep_logs_only
from jobs.liveness import is_same_process, pid_alive
from jobs.outcome import describe_sample
from jobs.presence import HOST, STALE_AFTER, is_alive, lock_notice_of
from storage import jobs_table
from storage.lock_waits import LockNotice
from storage.queries import last_sample, supervisors


def why_orphaned(job: dict, owner: dict | None, now: float, boot: str, trust_heartbeats: bool = True,
                 lock_notice: LockNotice | None = None) -> str | None:
    """Why `job` can no longer be running, or None while its supervisor may still be running it. Without
    `trust_heartbeats` (a lock just held every writer up) an old job heartbeat is no evidence; a supervisor
    whose `lock_notice` says it waits for the lock is alive."""
    if job["boot_id"] is not None and job["boot_id"] != boot:
        return "the host restarted while this job ran"
    who = f"its supervisor ({job['supervisor_id']})"
    if owner is not None and not is_alive(owner, now, boot, lock_notice):
        return f"{who} stopped while the job was running"
    heartbeat = job["heartbeat_at"] or job["started_at"] or 0.0
    if now - heartbeat > STALE_AFTER and trust_heartbeats:
        return f"{who} stopped tending the job (no heartbeat for {now - heartbeat:.0f} s)"
    return None


def orphans(db: sqlite_utils.Database, now: float, *, boot: str, own_id: str | None = None,
            trust_heartbeats: bool = True) -> list[tuple[dict, str]]:
    """Every running job (not supervisor `own_id`'s) that `why_orphaned` finds, with the reason; reads only.
    While a worker waits for another process's lock (its notice, `storage.lock_waits`) no heartbeat could be
    written: that worker is alive, and no job's heartbeat is evidence."""
    by_id = {s["id"]: s for s in supervisors(db)}
    notice = lock_notice_of(db)
    found = []
    for job in db.query("SELECT * FROM jobs WHERE status = 'running' AND supervisor_id IS NOT ?", [own_id]):
        reason = why_orphaned(job, by_id.get(job["supervisor_id"]), now, boot,
                              trust_heartbeats and notice is None, notice)
        if reason is not None:
            found.append((job, reason))
    return found


def recover_orphans(db: sqlite_utils.Database, data_dir: str | Path, now: float, *, boot: str,
                    own_id: str | None = None, trust_heartbeats: bool = True) -> list[int]:
    """End `interrupted` every job `orphans` finds; returns their ids."""
    recovered = []
    for job, reason in orphans(db, now, boot=boot, own_id=own_id, trust_heartbeats=trust_heartbeats):
        same_boot = job["boot_id"] in (None, boot)
        if same_boot and str(job["supervisor_id"]).startswith(f"{HOST}:") and \
                is_same_process(job["pid"], job["pid_start"]):
            try:
                os.kill(job["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        sweep_job_cgroups([job["id"]], supervisor_alive=pid_alive)
        keep_logs_only(db, data_dir, job["id"])
        last = describe_sample(last_sample(db, job["id"]), job["progress_total"])
        if jobs_table.finish(db, job["id"], "interrupted", error=f"interrupted: {reason}; {last}"):
            recovered.append(job["id"])
    return recovered
