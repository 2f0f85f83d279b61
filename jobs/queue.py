"""Queue operations on the `jobs` table: submit, claim, cancel, retry, finish.

Every read-then-write runs in one `BEGIN IMMEDIATE` transaction, so two
supervisors (or a supervisor and a dashboard) never act on the same row twice.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import sqlite_utils

from core.errors import DrainboardError
from storage.config import Config
from storage.connections import transaction
from storage.queries import get_job
from storage.schema import FINAL_STATUSES

if TYPE_CHECKING:
    from jobs.spec import JobSpec  # annotations only: listing and cancelling jobs stay torch-free


class JobStateError(DrainboardError):
    """The job does not exist or is in a state that does not allow the operation."""


def enqueue(db: sqlite_utils.Database, spec: JobSpec, *, retry_of: int | None = None) -> int:
    """Queue a validated spec; returns the new job's id."""
    return db["jobs"].insert(_job_row(spec, retry_of)).last_rowid


def _job_row(spec: JobSpec, retry_of: int | None) -> dict[str, Any]:
    return {"kind": spec.kind, "spec": json.dumps(spec.to_dict()), "status": "queued", "created_at": time.time(),
            "retry_of": retry_of}


def submit(db: sqlite_utils.Database, raw: Mapping[str, Any], config: Config) -> int:
    """Validate user input (raises `JobSpecError`, nothing queued), check its forecast fits (raises
    `jobs.admission.JobRefused` unless forced, nothing queued) and queue it; returns the job id."""
    from jobs.admission import admit
    from jobs.spec import build_spec

    return queue_spec(db, admit(build_spec(raw, config), config, db), config.data_dir)


def queue_spec(db: sqlite_utils.Database, spec: JobSpec, data_dir: str | Path, *, retry_of: int | None = None) -> int:
    """Queue a validated spec; a generate job's input images are copied into its folder in the same
    transaction (`jobs.inputs`), so no worker claims it before they are there. Returns the job id."""
    images = spec.generate.input_images() if spec.generate is not None else {}
    if not images:
        return enqueue(db, spec, retry_of=retry_of)
    from jobs.inputs import copy_inputs

    row = _job_row(spec, retry_of)
    with transaction(db) as conn:
        job_id = conn.execute(f"INSERT INTO jobs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                              list(row.values())).lastrowid
        copy_inputs(conn, data_dir, job_id, images)
    return job_id


def claim(db: sqlite_utils.Database, supervisor_id: str, *, boot_id: str | None = None) -> dict | None:
    """Take the oldest queued job for `supervisor_id` and mark it running; None when the queue is empty.

    The job's heartbeat starts now, and `boot_id` (the host's boot) is stored
    with it, so a supervisor of a later boot knows the host restarted under it.
    """
    with transaction(db) as conn:
        row = conn.execute("SELECT id FROM jobs WHERE status = 'queued' ORDER BY id LIMIT 1").fetchone()
        if row is None:
            return None
        now = time.time()
        conn.execute(
            "UPDATE jobs SET status = 'running', started_at = ?, heartbeat_at = ?, supervisor_id = ?, boot_id = ? "
            "WHERE id = ?",
            [now, now, supervisor_id, boot_id, row[0]],
        )
    return get_job(db, row[0])


def cancel(db: sqlite_utils.Database, job_id: int) -> str:
    """Cancel a job: a queued one is cancelled at once; a running one is flagged, and its
    supervisor sends SIGTERM, then SIGKILL after a grace period. Returns the status now."""
    with transaction(db) as conn:
        row = conn.execute("SELECT status FROM jobs WHERE id = ?", [job_id]).fetchone()
        if row is None:
            raise JobStateError(f"job {job_id} does not exist")
        status = row[0]
        if status in FINAL_STATUSES:
            raise JobStateError(f"job {job_id} is already {status}")
        if status == "queued":
            conn.execute(
                "UPDATE jobs SET status = 'cancelled', finished_at = ?, error = 'cancelled while queued' WHERE id = ?",
                [time.time(), job_id],
            )
            return "cancelled"
        conn.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", [job_id])
        return "running"


def retry(db: sqlite_utils.Database, job_id: int, config: Config, *, changes: Mapping[str, Any] | None = None) -> int:
    """Queue a new job with the spec of `job_id` (which must have finished), `changes` applied; returns its id.

    The spec is validated again (`build_spec`, raising `JobSpecError`): the model may have moved, a
    device gone, or a limit no longer apply since the first run.
    """
    job = get_job(db, job_id)
    if job is None:
        raise JobStateError(f"job {job_id} does not exist")
    if job["status"] not in FINAL_STATUSES:
        raise JobStateError(f"job {job_id} is still {job['status']}; cancel it before retrying")
    from jobs.admission import admit
    from jobs.inputs import reuse_inputs
    from jobs.spec import build_spec

    stored = dict(job["spec"])
    if "offload_set" in stored:  # only the flags the user set are input again; the policy decides the others
        stored["offload"] = {k: v for k, v in (stored.get("offload") or {}).items() if k in stored["offload_set"]}
    raw = reuse_inputs({k: v for k, v in {**stored, **(changes or {})}.items() if k not in ("forecast", "offload_set")},
                       job["spec"], config.data_dir, job_id)
    return queue_spec(db, admit(build_spec(raw, config), config, db), config.data_dir, retry_of=job_id)


def finish(
    db: sqlite_utils.Database,
    job_id: int,
    status: str,
    *,
    error: str | None = None,
    exit_code: int | None = None,
    signal: str | None = None,
    metrics: dict | None = None,
) -> bool:
    """Record how a job ended; False (nothing written) when it had already ended, e.g. another
    supervisor recovered it meanwhile. `metrics` given here are merged over those the child stored."""
    if status not in FINAL_STATUSES:
        raise ValueError(f"{status!r} is not a final status; expected one of {sorted(FINAL_STATUSES)}")
    with transaction(db) as conn:
        stored = conn.execute("SELECT metrics, status FROM jobs WHERE id = ?", [job_id]).fetchone()
        if stored is None or stored[1] in FINAL_STATUSES:
            return False
        merged = json.loads(stored[0]) if stored[0] else None
        if metrics:
            merged = {**(merged or {}), **metrics}
        conn.execute(
            "UPDATE jobs SET status = ?, finished_at = ?, error = coalesce(?, error), exit_code = ?, signal = ?, "
            "metrics = ? WHERE id = ?",
            [status, time.time(), error, exit_code, signal, json.dumps(merged) if merged is not None else None, job_id],
        )
    return True
