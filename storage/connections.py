"""The one place a database connection is opened: WAL mode and a busy timeout.

WAL lets the dashboard read while a job child writes samples; the busy timeout
makes a writer wait for another writer instead of failing "database is locked".
Connections are per thread (sqlite3's rule): open one where you use it.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import sqlite_utils

BUSY_TIMEOUT_MS = 30_000


def connect(path: str | Path, *, ensure: bool = True, check_same_thread: bool = True) -> sqlite_utils.Database:
    """Open (creating if needed) the database at `path` with WAL and a busy timeout.

    With `ensure`, the schema is created or migrated to the current version.
    The connection is in autocommit mode: multi-statement writes open their own
    `BEGIN IMMEDIATE` transaction (see `transaction`). `check_same_thread=False`
    is for callers that guard the connection with their own lock.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(
        str(path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=check_same_thread
    )
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = ON")
    db = sqlite_utils.Database(conn)
    if ensure:
        from storage.schema import ensure_schema

        ensure_schema(db)
    return db


@contextmanager
def transaction(db: sqlite_utils.Database) -> Iterator[sqlite3.Connection]:
    """One write transaction taken up front (`BEGIN IMMEDIATE`), so a read-then-write
    (claiming a job, migrating) cannot interleave with another writer."""
    conn = db.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # a COMMIT that failed (disk full) may leave it open
            conn.execute("ROLLBACK")
        raise


def is_database_full(exc: BaseException) -> bool:
    """True for SQLite's "database or disk is full" (SQLITE_FULL), however the statement was run."""
    return isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
