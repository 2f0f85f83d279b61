"""How a job child that ended is recorded: its outcome and error in words, its files kept or removed.

The supervisor (`jobs.supervisor`) starts and watches the child; once it has
exited, or died unattended, this decides what its end was (succeeded, failed,
killed with the signal or memory guard named, cancelled, interrupted when its
fork server stopped) from the exit code, the cgroup, the guard's trip, the fork
server and the sample relay, and records it
(`storage.jobs_table.finish`).
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import sqlite_utils

from jobs.cgroups import JobCgroup
from jobs.child import EXIT_DISK_FULL, EXIT_DONE, EXIT_INVALID_SPEC
from jobs.forkserver import ForkedChild
from jobs.guard import GuardTrip, MemoryGuard
from jobs.outcome import describe_sample, guard_error, kill_reason
from jobs.samples import SampleRelay
from core.diskspace import free_bytes
from core.errors import DiskFullError
from storage import jobs_table
from storage.artifacts import job_dir, record_artifact, remove_unrecorded
from storage.config import Config
from storage.connections import is_database_full
from storage.events_table import add_event
from storage.queries import get_job, last_sample
from storage.schema import FINAL_STATUSES


@dataclass
class RunningChild:
    """A job's child process and what watches it, while the supervisor has it in hand."""

    job_id: int
    process: subprocess.Popen | ForkedChild
    log_path: Path
    cgroup: JobCgroup | None
    relay: SampleRelay
    guard: MemoryGuard | None
    term_sent_at: float | None = None


def record_exit(db: sqlite_utils.Database, config: Config, running: RunningChild, code: int) -> str | None:
    """Record how the child ended, unless another supervisor took the job for dead meanwhile, and register its
    log. Returns what of the job's folder is gone (for the worker log), None when it is all there."""
    job = get_job(db, running.job_id)
    oom_kills = running.cgroup.oom_kills() if running.cgroup else None
    if running.cgroup:
        running.cgroup.remove()
    missing = None if running.log_path.is_file() else \
        f"the job's artifact folder {running.log_path.parent} was deleted while it ran: its log and outputs are gone"
    if job["status"] not in FINAL_STATUSES:
        _record_end(db, config, running, job, code, oom_kills, missing)
    if missing is None:
        record_artifact(db, config.data_dir, running.job_id, running.log_path)
    return missing


def keep_logs_only(db: sqlite_utils.Database, data_dir: Path, job_id: int) -> None:
    """A job that died unattended: register its child log, delete what else it left unregistered."""
    for log in sorted(job_dir(data_dir, job_id).glob("child*.log")):
        record_artifact(db, data_dir, job_id, log)
    remove_unrecorded(db, data_dir, job_id)


def _record_end(db: sqlite_utils.Database, config: Config, running: RunningChild, job: dict, code: int,
                oom_kills: int | None, missing: str | None) -> None:
    """The job's final status and error; written first, since on a nearly full disk it matters most.
    `missing` says what of the job's folder is gone: added to the error, or a warning event of a success."""
    metrics = {"memory_limit": running.cgroup.limit, "cgroup_oom_kills": oom_kills} if running.cgroup else None
    signal_name = signal.Signals(-code).name if code < 0 else None
    trip = running.guard.trip if running.guard else None
    if trip is not None:
        _record_guard_event(db, running, trip)
        status, error = "killed", guard_error(trip, job["progress_total"])
        metrics = {**(metrics or {}), "memory_guard": trip.to_dict()}
    elif running.relay.error is not None:  # the job was stopped: its samples could not be stored
        status, error = "failed", _disk_full_error(config, running, code) \
            or f"the job's samples could not be stored: {running.relay.error}"
    elif job["cancel_requested"]:
        status, error = "cancelled", f"cancelled while running{f' ({signal_name})' if signal_name else ''}"
    elif isinstance(running.process, ForkedChild) and running.process.server_stopped:
        last = describe_sample(last_sample(db, job["id"]), job["progress_total"])
        status = "interrupted"
        error = f"interrupted: its fork server stopped ({running.process.server_stopped}), and the job with it; {last}"
    elif code == EXIT_DONE:
        status, error = "succeeded", None
    elif code > 0:
        status, error = "failed", job["error"] or _disk_full_error(config, running, code) \
            or _log_tail(running.log_path) or f"the job process exited with code {code}"
        if code == EXIT_INVALID_SPEC and not error.startswith("invalid spec"):
            error = f"invalid spec: {error}"
    else:
        limit = running.cgroup.limit if running.cgroup else None
        last = describe_sample(last_sample(db, job["id"]), job["progress_total"])
        status = "killed"
        error = f"{kill_reason(signal_name, limit=limit, oom_kills=oom_kills)}; {last}"
    if status != "succeeded":
        remove_unrecorded(db, config.data_dir, job["id"], keep=(running.log_path.name,))
    if missing is not None and status == "succeeded":
        add_event(db, job["id"], "warning", missing, t=(running.relay.last or {}).get("t", 0.0))
    elif missing is not None:
        error = f"{error}; {missing}" if error else missing
    jobs_table.finish(db, job["id"], status, error=error, exit_code=code, signal=signal_name, metrics=metrics)


def _disk_full_error(config: Config, running: RunningChild, code: int) -> str | None:
    """The error of a job whose samples or error the database refused for lack of room."""
    error = running.relay.error
    refused = error if error is not None and (isinstance(error, DiskFullError) or is_database_full(error)) else None
    if code != EXIT_DISK_FULL and refused is None:
        return None
    what = "its samples" if refused is not None else "its error"
    return (f"disk full: cannot write to the database {config.db_path} "
            f"({free_bytes(config.db_path):,} bytes free): the job could not record {what}"
            + (f": {refused}" if refused is not None else ""))


def _record_guard_event(db: sqlite_utils.Database, running: RunningChild, trip: GuardTrip) -> None:
    """The guard's stop as a job event at the moment of the trip (drawn on the Job chart like an OOM kill)."""
    t0 = running.relay.t0
    t = trip.at - t0 if t0 is not None else (trip.sample or {}).get("t", 0.0)
    add_event(db, running.job_id, "memory_guard", f"memory guard: {trip.message}", t=t,
              stage=(trip.sample or {}).get("stage"), data=trip.to_dict())


def _log_tail(path: Path) -> str | None:
    """The last non-blank line of the child's log: its own last word when it stored no error."""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    return lines[-1] if lines else None
