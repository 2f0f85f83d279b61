"""Queue operations: submit, claim, cancel, move to the front, clear, retry.

What a user or a supervisor asks of the queue, checked and said in words here;
the rows change through `storage.jobs_table`, the one writer of the `jobs` table.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import sqlite_utils

from core.errors import DrainboardError
from storage import jobs_table
from storage.config import Config
from storage.connections import transaction
from storage.queries import get_job
from storage.schema import FINAL_STATUSES

if TYPE_CHECKING:
    from jobs.spec import JobSpec  # annotations only: listing and cancelling jobs stay torch-free


class JobStateError(DrainboardError):
    """The job does not exist or is in a state that does not allow the operation."""


def enqueue(db: jobs_table.Executor, spec: JobSpec, *, retry_of: int | None = None) -> int:
    """Queue a validated spec; returns the new job's id."""
    return jobs_table.enqueue(db, spec.kind, spec.to_dict(), retry_of=retry_of)


def submit(db: sqlite_utils.Database, raw: Mapping[str, Any], config: Config) -> int:
    """Validate user input (raises `JobSpecError`, nothing queued), check its forecast fits (raises
    `jobs.admission.JobRefused` unless forced, nothing queued) and queue it; returns the job id."""
    from jobs.admission import admit
    from jobs.spec import build_spec

    return queue_spec(db, admit(build_spec(raw, config), config, db), config.data_dir)


def queue_spec(db: sqlite_utils.Database, spec: JobSpec, data_dir: str | Path, *, retry_of: int | None = None) -> int:
    """Queue a validated spec; a generate job's input files (images, a clip) are copied into its folder in the same
    transaction (`jobs.input_copies`), so no worker claims it before they are there. Returns the job id."""
    files = spec.job_kind.input_files(spec)
    if not files:
        return enqueue(db, spec, retry_of=retry_of)
    from jobs.input_copies import copy_inputs

    with transaction(db) as conn:
        job_id = enqueue(conn, spec, retry_of=retry_of)
        copy_inputs(conn, data_dir, job_id, files)
    return job_id


def claim(db: sqlite_utils.Database, supervisor_id: str, *, boot_id: str | None = None) -> dict | None:
    """Take the oldest queued job for `supervisor_id` and mark it running; None when the queue is empty.

    The job's heartbeat starts now, and `boot_id` (the host's boot) is stored
    with it, so a supervisor of a later boot knows the host restarted under it.
    """
    job_id = jobs_table.claim_oldest(db, supervisor_id, boot_id=boot_id)
    return None if job_id is None else get_job(db, job_id)


def cancel(db: sqlite_utils.Database, job_id: int) -> str:
    """Cancel a job: a queued one is cancelled at once; a running one is flagged, and its
    supervisor sends SIGTERM, then SIGKILL after a grace period. Returns the status now."""
    status = jobs_table.request_cancel(db, job_id)
    if status is None:
        raise JobStateError(f"job {job_id} does not exist")
    if status in FINAL_STATUSES:
        raise JobStateError(f"job {job_id} is already {status}")
    return "cancelled" if status == "queued" else "running"


def move_to_front(db: sqlite_utils.Database, job_id: int) -> None:
    """Put a queued job first in the queue: the next job a worker takes."""
    status = jobs_table.move_to_front(db, job_id)
    if status is None:
        raise JobStateError(f"job {job_id} does not exist")
    if status != "queued":
        raise JobStateError(f"job {job_id} is {status}, not queued: only a queued job can be moved")


def clear_queue(db: sqlite_utils.Database) -> list[int]:
    """Cancel every queued job (a running one keeps running); returns their ids, in queue order."""
    return jobs_table.cancel_queued(db)


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
    from jobs.input_copies import reuse_inputs
    from jobs.spec import build_spec

    stored = dict(job["spec"])
    if "offload_set" in stored:  # only the flags the user set are input again; the policy decides the others
        stored["offload"] = {k: v for k, v in (stored.get("offload") or {}).items() if k in stored["offload_set"]}
    raw = reuse_inputs({k: v for k, v in {**stored, **(changes or {})}.items() if k not in ("forecast", "offload_set", "model_roots")},
                       job["spec"], config.data_dir, job_id)
    return queue_spec(db, admit(build_spec(raw, config), config, db), config.data_dir, retry_of=job_id)

