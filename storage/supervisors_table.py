"""The one writer of the `supervisors` table: a supervisor's row from its start to its stop.

A supervisor registers itself, beats its heartbeat (with the job it runs) and
marks its stop; `jobs.presence` and `jobs.recovery` read the rows
(`storage.queries.supervisors`) to tell a live supervisor from a dead one.
`tests/storage/test_table_owners.py` fails when code elsewhere writes the table.
"""

from __future__ import annotations

from storage.connections import Executor


def register(db: Executor, supervisor_id: str, *, pid: int, host: str, boot_id: str | None, now: float) -> None:
    """The row of a supervisor starting now, its heartbeat now."""
    db.execute("INSERT INTO supervisors (id, pid, host, started_at, heartbeat_at, boot_id) VALUES (?, ?, ?, ?, ?, ?)",
               [supervisor_id, pid, host, now, now, boot_id])


def heartbeat(db: Executor, supervisor_id: str, current_job: int | None, now: float) -> None:
    """The supervisor is alive at `now`, running `current_job` (None: idle)."""
    db.execute("UPDATE supervisors SET heartbeat_at = ?, current_job = ? WHERE id = ?", [now, current_job, supervisor_id])


def stopped(db: Executor, supervisor_id: str, now: float) -> None:
    """The supervisor stopped at `now`, running nothing."""
    db.execute("UPDATE supervisors SET stopped_at = ?, current_job = NULL WHERE id = ?", [now, supervisor_id])
