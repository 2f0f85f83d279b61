"""The one writer of the `events` table: what happened to a job, a row per event, in the order written.

A child's reporter (its stages, steps, decisions and warnings), the supervisor
(a lock it waited out), a child's ending (the memory guard's stop, a warning)
and the Ray backend all add through `add_event`, so what an event row holds is
said once. Reads stay with their readers (`storage.queries.events`, `since_id=`).
`tests/storage/test_table_owners.py` fails when code elsewhere writes the table.
"""

from __future__ import annotations

import json
import time
from typing import Any

from storage.connections import Executor


def add_event(db: Executor, job_id: int, kind: str, message: str, *, t: float = 0.0, stage: str | None = None,
              data: dict[str, Any] | str | None = None, created_at: float | None = None) -> None:
    """One event of job `job_id` at `t` seconds since its start (0.0 when it has no clock of the job's):
    `data` a dict (stored as JSON), JSON text as a reporter's record carries it, or None."""
    db.execute("INSERT INTO events (job_id, t, created_at, kind, stage, message, data) VALUES (?, ?, ?, ?, ?, ?, ?)",
               [job_id, t, time.time() if created_at is None else created_at, kind, stage, message,
                json.dumps(data) if isinstance(data, dict) else data])
