"""The one writer of the `jobs` table: every change to a job's row is a named transition here.

The queue, the supervisor, a child's reporter, a backend, the benches and the
test fixtures all call these, so a job's life (queued, claimed, its pid,
heartbeat, stage, progress, metrics and error, a cancel request, its end, its
deletion) reads in one place, the way huey keeps every queue operation behind
one storage interface. Reads stay with their readers (`storage.queries`).
`tests/storage/test_table_owners.py` fails when code elsewhere writes the table (every table has
one owner in `storage/`).

`db` is a sqlite_utils Database, or the sqlite3 connection of a caller's
`transaction` where the write must share it (a job queued with its inputs
copied). A transition that reads before it writes opens its own `BEGIN IMMEDIATE`,
so two supervisors (or a supervisor and a page) never act on the same row twice.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

import sqlite_utils

from storage.connections import Executor, transaction
from storage.schema import FINAL_STATUSES


QUEUE_ORDER = "coalesce(queue_rank, id), id"
"""The order queued jobs are claimed in: submission order (their ids) unless one was moved to the front."""


def enqueue(db: Executor, kind: str, spec: dict[str, Any], *, retry_of: int | None = None,
            now: float | None = None) -> int:
    """A new `queued` row for `spec` (a retry names the job it retries); returns its id."""
    return db.execute("INSERT INTO jobs (kind, spec, status, created_at, retry_of) VALUES (?, ?, 'queued', ?, ?)",
                      [kind, json.dumps(spec), _now(now), retry_of]).lastrowid


def claim_oldest(db: sqlite_utils.Database, supervisor_id: str, *, boot_id: str | None = None,
                 now: float | None = None) -> int | None:
    """The first queued job (QUEUE_ORDER: the oldest, unless one was moved to the front) is `start`ed for
    `supervisor_id`; returns its id, None when nothing is queued."""
    with transaction(db) as conn:
        row = conn.execute(f"SELECT id FROM jobs WHERE status = 'queued' ORDER BY {QUEUE_ORDER} LIMIT 1").fetchone()
        if row is not None:
            start(conn, row[0], supervisor_id=supervisor_id, boot_id=boot_id, now=now)
    return None if row is None else row[0]


def start(db: Executor, job_id: int, *, supervisor_id: str, boot_id: str | None = None,
          now: float | None = None) -> None:
    """The job is `running` for `supervisor_id`, its heartbeat starting now and the host's boot stored with it
    (a supervisor of a later boot then knows the host restarted under it). A supervisor takes jobs through
    `claim_oldest`; a fixture or a bench that needs a job running calls this."""
    now = _now(now)
    db.execute("UPDATE jobs SET status = 'running', started_at = ?, heartbeat_at = ?, supervisor_id = ?, boot_id = ? "
               "WHERE id = ?", [now, now, supervisor_id, boot_id, job_id])


def record_process(db: Executor, job_id: int, pid: int, pid_start: int | None) -> None:
    """The child process running the job (its start time tells a recycled pid apart)."""
    db.execute("UPDATE jobs SET pid = ?, pid_start = ? WHERE id = ?", [pid, pid_start, job_id])


def heartbeat(db: Executor, job_id: int, now: float) -> None:
    """The job's supervisor still tends it."""
    db.execute("UPDATE jobs SET heartbeat_at = ? WHERE id = ?", [now, job_id])


def set_stage(db: Executor, job_id: int, name: str) -> None:
    """The stage the job is in now."""
    db.execute("UPDATE jobs SET stage = ? WHERE id = ?", [name, job_id])


def set_stage_unless_set(db: Executor, job_id: int, name: str) -> None:
    """A stage said from outside the job (waiting for a cluster) that never hides one the job reported."""
    db.execute("UPDATE jobs SET stage = coalesce(stage, ?) WHERE id = ?", [name, job_id])


def set_progress(db: Executor, job_id: int, done: int, total: int | None) -> None:
    """Steps done of total (None: not known yet)."""
    db.execute("UPDATE jobs SET progress_done = ?, progress_total = ? WHERE id = ?", [done, total, job_id])


def set_metrics(db: Executor, job_id: int, metrics: dict[str, Any]) -> None:
    """What the job's kind returned (`finish` merges its own over these)."""
    db.execute("UPDATE jobs SET metrics = ? WHERE id = ?", [json.dumps(metrics), job_id])


def set_error(db: Executor, job_id: int, summary: str, detail: str | None) -> None:
    """Why the job failed, in the child's words, before its end is recorded."""
    db.execute("UPDATE jobs SET error = ?, error_detail = ? WHERE id = ?", [summary, detail, job_id])


def request_cancel(db: sqlite_utils.Database, job_id: int, *, now: float | None = None) -> str | None:
    """A queued job ends `cancelled` at once; a running one is flagged for its supervisor to stop; a finished
    one is left alone. Returns the status the job had (None: no such job), so the caller can say why not."""
    with transaction(db) as conn:
        row = conn.execute("SELECT status FROM jobs WHERE id = ?", [job_id]).fetchone()
        if row is None or row[0] in FINAL_STATUSES:
            return None if row is None else row[0]
        if row[0] == "queued":
            conn.execute("UPDATE jobs SET status = 'cancelled', finished_at = ?, error = 'cancelled while queued' "
                         "WHERE id = ?", [_now(now), job_id])
        else:
            conn.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", [job_id])
        return row[0]


def move_to_front(db: sqlite_utils.Database, job_id: int) -> str | None:
    """A queued job is placed before every other queued job; any other is left alone. Returns the status the job
    had (None: no such job), so the caller can say why not."""
    with transaction(db) as conn:
        row = conn.execute("SELECT status FROM jobs WHERE id = ?", [job_id]).fetchone()
        if row is not None and row[0] == "queued":
            first = conn.execute("SELECT min(coalesce(queue_rank, id)) FROM jobs WHERE status = 'queued'").fetchone()[0]
            conn.execute("UPDATE jobs SET queue_rank = ? WHERE id = ?", [first - 1, job_id])
        return None if row is None else row[0]


def cancel_queued(db: sqlite_utils.Database, *, now: float | None = None) -> list[int]:
    """Every queued job ends `cancelled` at once (a running one is left to run); returns their ids."""
    with transaction(db) as conn:
        ids = [r[0] for r in conn.execute(f"SELECT id FROM jobs WHERE status = 'queued' ORDER BY {QUEUE_ORDER}")]
        conn.execute("UPDATE jobs SET status = 'cancelled', finished_at = ?, error = 'cancelled while queued "
                     "(the queue was cleared)' WHERE status = 'queued'", [_now(now)])
    return ids


def finish(db: sqlite_utils.Database, job_id: int, outcome: str, *, error: str | None = None,
           exit_code: int | None = None, signal: str | None = None, metrics: dict | None = None,
           now: float | None = None) -> bool:
    """The job ends with `outcome` (a final status); `error` replaces the stored one only when given, `metrics`
    are merged over those the child stored. False, nothing written, when it had already ended (another
    supervisor recovered it meanwhile)."""
    if outcome not in FINAL_STATUSES:
        raise ValueError(f"{outcome!r} is not a final status; expected one of {sorted(FINAL_STATUSES)}")
    with transaction(db) as conn:
        stored = conn.execute("SELECT metrics, status FROM jobs WHERE id = ?", [job_id]).fetchone()
        if stored is None or stored[1] in FINAL_STATUSES:
            return False
        merged = json.loads(stored[0]) if stored[0] else None
        if metrics:
            merged = {**(merged or {}), **metrics}
        conn.execute("UPDATE jobs SET status = ?, finished_at = ?, error = coalesce(?, error), exit_code = ?, "
                     "signal = ?, metrics = ? WHERE id = ?",
                     [outcome, _now(now), error, exit_code, signal,
                      json.dumps(merged) if merged is not None else None, job_id])
    return True


def delete(conn: sqlite3.Connection, job_id: int) -> None:
    """The job's row goes, inside the caller's transaction (which removes what hangs off it); its retries
    keep their rows but lose the link."""
    conn.execute("UPDATE jobs SET retry_of = NULL WHERE retry_of = ?", [job_id])
    conn.execute("DELETE FROM jobs WHERE id = ?", [job_id])


def _now(now: float | None) -> float:
    return time.time() if now is None else now
