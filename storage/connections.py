"""The one place a database connection is opened: WAL mode and a busy timeout.

WAL lets the dashboard read while a job child writes samples; the busy timeout
makes a writer wait for another writer instead of failing "database is locked".
Connections are per thread (sqlite3's rule): open one where you use it.

Durability: `synchronous = NORMAL` (the default here) never corrupts the
database, but a power cut or a frozen host may lose the commits since the last
WAL checkpoint. A `durable` connection (`synchronous = FULL`) fsyncs the WAL
at every commit; the sample writer uses one, and since an fsync of the WAL file
carries every frame before it, each of its commits (at least every
`flush_interval`) also makes the other connections' earlier writes durable.

Damage: a file SQLite finds malformed (garbage over a table) or not a
database at all becomes `DatabaseDamagedError`, one line naming the file
(`damage_error`). Opening waits at most `OPEN_TIMEOUT_MS` for a lock: in WAL
mode an open waits only while another process holds the file in a state no
reader should wait for (a database truncated under a live worker), so that is
said at once instead of after the 30 s a writer may wait for another writer.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import sqlite_utils

from core.errors import DrainboardError

BUSY_TIMEOUT_MS = 30_000
"""How long a statement waits for another writer's lock (the sample writer commits at least every second)."""
OPEN_TIMEOUT_MS = 3_000
"""How long opening the database waits for a lock before saying why it cannot go on."""
_DAMAGED_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


class DatabaseDamagedError(DrainboardError):
    """The job database is malformed, not a database, or held locked by a process that truncated or
    replaced it under the others; the message names the file."""


def damage_error(exc: BaseException, path: str | Path) -> DatabaseDamagedError | None:
    """The one-line error for a damaged database at `path`, or None when `exc` is something else."""
    if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) in _DAMAGED_CODES:
        return DatabaseDamagedError(f"the job database at {path} is damaged: {exc}; move it aside (the next "
                                    f"start creates an empty one) or restore it from a copy")
    return None


def connect(
    path: str | Path, *, check_same_thread: bool = True, durable: bool = False
) -> sqlite_utils.Database:
    """Open (creating if needed) the database at `path` with WAL and a busy timeout; the schema is not
    touched (the product opens its database with `storage.schema.open_database`, which migrates).

    The connection is in autocommit mode: multi-statement writes open their own
    `BEGIN IMMEDIATE` transaction (see `transaction`). `check_same_thread=False`
    is for callers that guard the connection with their own lock. `durable`
    fsyncs at every commit (see the module docstring).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(
        str(path), timeout=OPEN_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=check_same_thread
    )
    try:
        _open(conn, path)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        conn.execute("PRAGMA foreign_keys = ON")
    except BaseException as e:
        conn.close()
        damaged = damage_error(e, path)
        if damaged is not None:
            raise damaged from e
        raise
    return sqlite_utils.Database(conn)


def _open(conn: sqlite3.Connection, path: Path) -> None:
    """WAL mode and a first read of the header, waiting `OPEN_TIMEOUT_MS` at most for a lock."""
    conn.execute(f"PRAGMA busy_timeout = {OPEN_TIMEOUT_MS}")
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA user_version")
    except sqlite3.OperationalError as e:
        if getattr(e, "sqlite_errorcode", None) != sqlite3.SQLITE_BUSY:
            raise
        raise DatabaseDamagedError(
            f"the job database at {path} stayed locked for {OPEN_TIMEOUT_MS / 1000:g} s on opening: a process "
            f"that has it open holds it in a state no reader waits for, which is what a database file truncated "
            f"or replaced under a running worker looks like; stop the worker, then check the file") from None


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


def checkpoint_wal(db: sqlite_utils.Database) -> bool:
    """Copy the WAL into the database and truncate it; True when it completed.

    On a full disk this is what frees room: the WAL holds a frame for every
    commit of a page (a heartbeat row rewritten every second), the database one
    copy. It completes only while no other connection reads an old snapshot.
    """
    try:
        busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.Error:
        return False
    return busy == 0
