"""Where a job child reports to: the database on this machine, or the line protocol (`jobs.wire`).

`JobContext` and the child entry point (`jobs.child`) speak only to a `Reporter`,
so a kind runs the same whether its child writes SQLite itself (the embedded
supervisor) or streams to a supervisor on another machine (the Ray backend).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, Protocol

from jobs.samples import DatabaseSink, SampleSink

from storage import jobs_table
from storage.artifacts import record_artifact
from storage.connections import is_database_full
from storage.events_table import add_event
from storage.lock_waits import LockWait
from storage.schema import open_database
from storage.queries import get_job


EVENT_FIELDS = ("t", "created_at", "kind", "stage", "message", "data")
"""The columns of an events row a reporter is given (its job_id is the reporter's own)."""


class Reporter(Protocol):
    """What a job child tells about its job, beside its samples (`jobs.samples.SampleSink`)."""

    remote: bool
    """Whether the child runs away from its supervisor, so it must run the memory guard itself."""

    def spec(self) -> dict[str, Any] | None:
        """The job's stored spec; None when the job does not exist."""

    def sample_sink(self, t0: float, clock: Callable[[], float]) -> SampleSink:
        """Where the job's samples go when no sample pipe is given."""

    def event(self, row: dict[str, Any]) -> None:
        """An events row (t, created_at, kind, stage, message, data as JSON text); job_id is added."""

    def stage(self, name: str) -> None:
        """The job's current stage."""

    def progress(self, done: int, total: int | None) -> None:
        """Steps done of total."""

    def artifact(self, path: Path) -> None:
        """A finished file in the job's artifact folder."""

    def metrics(self, metrics: dict[str, Any]) -> None:
        """What the kind returned, once it is done."""

    def error(self, summary: str, detail: str | None) -> None:
        """Why the job failed (a database too full to take it is tolerated: the exit code says disk full)."""

    def close(self) -> None:
        """Release what the reporter holds."""


class DatabaseReporter:
    """Writes into the job's rows of the database at `db_path` (the child shares the supervisor's machine);
    a write meeting another process's lock waits it out (`storage.lock_waits`): the job pauses, loses nothing."""

    remote = False

    def __init__(self, job_id: int, db_path: str | Path, data_dir: str | Path):
        self.job_id = job_id
        self._db_path = db_path
        self._data_dir = Path(data_dir)
        self._db = open_database(db_path, check_same_thread=False, lock_wait=LockWait())
        self._lock = threading.Lock()

    def spec(self) -> dict[str, Any] | None:
        job = get_job(self._db, self.job_id)
        return None if job is None else job["spec"]

    def sample_sink(self, t0: float, clock: Callable[[], float]) -> DatabaseSink:
        return DatabaseSink(self._db_path, self.job_id, t0=t0, clock=clock)

    def event(self, row: dict[str, Any]) -> None:
        with self._lock:
            add_event(self._db, self.job_id, **{name: row[name] for name in EVENT_FIELDS})

    def stage(self, name: str) -> None:
        with self._lock:
            jobs_table.set_stage(self._db, self.job_id, name)

    def progress(self, done: int, total: int | None) -> None:
        with self._lock:
            jobs_table.set_progress(self._db, self.job_id, done, total)

    def artifact(self, path: Path) -> None:
        with self._lock:
            record_artifact(self._db, self._data_dir, self.job_id, path)

    def metrics(self, metrics: dict[str, Any]) -> None:
        with self._lock:
            jobs_table.set_metrics(self._db, self.job_id, metrics)

    def error(self, summary: str, detail: str | None) -> None:
        try:
            with self._lock:
                jobs_table.set_error(self._db, self.job_id, summary, detail)
        except sqlite3.Error as e:
            if not is_database_full(e):
                raise

    def close(self) -> None:
        self._db.conn.close()
