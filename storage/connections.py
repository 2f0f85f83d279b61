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

Refusals: a file SQLite finds malformed (garbage over a table) or not a
database at all becomes `DatabaseDamagedError`; a directory in the file's
place, a file or folder that cannot be opened or written (read-only media), a
lock held past the busy timeout, and a write-ahead log deleted under a live
connection become `DatabaseRefusedError`: one line naming the file and the
reason (`refusal_error`). Opening waits at most `OPEN_TIMEOUT_MS` for a lock: in WAL
mode an open waits only while another process holds the file in a state no
reader should wait for (a database truncated under a live worker), so that is
said at once instead of after the 30 s a writer may wait for another writer.

Reading needs no write: `connect(path, read_only=True)` opens the file
read-only and sets nothing (WAL mode is a write), so `jobs list` and `jobs
show` work on read-only media; where the `-shm` index cannot be created there
(a read-only filesystem) the file is opened `immutable`, which nothing can
change under it. A worker that must not die of another process's lock opens
with a `LockWait` (`storage.lock_waits`).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Union
from urllib.parse import quote

import sqlite_utils

from core.errors import DrainboardError
from storage.lock_waits import RETRY_AFTER_MS, LockWait, RetryingConnection, is_database_locked

Executor = Union[sqlite_utils.Database, sqlite3.Connection]
"""What a table's writer writes through: anything with `execute(sql, params)`, a database or the connection of an
open transaction."""

BUSY_TIMEOUT_MS = 30_000
"""How long a statement waits for another writer's lock (the sample writer commits at least every second)."""
OPEN_TIMEOUT_MS = 3_000
"""How long opening the database waits for a lock before saying why it cannot go on."""
_DAMAGED_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


class DatabaseRefusedError(DrainboardError):
    """The job database cannot be opened or written; the message names the file and why."""


class DatabaseDamagedError(DatabaseRefusedError):
    """The job database is malformed, not a database, or held locked by a process that truncated or
    replaced it under the others; the message names the file."""


def refusal_error(exc: BaseException, path: str | Path) -> DatabaseRefusedError | None:
    """The one-line error for a database at `path` that refused an open or a statement, or None when `exc`
    is something else (a full disk is the caller's to say, with the bytes free)."""
    if not isinstance(exc, sqlite3.Error):
        return None
    path = Path(path)
    code = getattr(exc, "sqlite_errorcode", None) or 0
    if code in _DAMAGED_CODES:
        return DatabaseDamagedError(f"the job database at {path} is damaged: {exc}; move it aside (the next "
                                    f"start creates an empty one) or restore it from a copy")
    if path.is_dir():
        return DatabaseRefusedError(f"the job database at {path} is a directory, not a database file; move it "
                                    f"aside (the next start creates an empty database there)")
    if is_database_locked(exc):
        return DatabaseRefusedError(f"the job database at {path} is locked by another process (a write or an open "
                                    f"transaction held past {BUSY_TIMEOUT_MS / 1000:g} s); try again once it ends")
    primary = code & 0xFF
    if primary == sqlite3.SQLITE_READONLY or (primary == sqlite3.SQLITE_CANTOPEN and _read_only_media(path)):
        return DatabaseRefusedError(f"the job database at {path} cannot be written: {_why_read_only(path)}; "
                                    f"reading works (`python -m jobs list`, `show`), queueing and running jobs "
                                    f"need a writable data folder")
    if primary == sqlite3.SQLITE_CANTOPEN:
        where = path.parent if not path.parent.is_dir() else None
        return DatabaseRefusedError(f"the job database at {path} cannot be opened: "
                                    + (f"its folder {where} does not exist" if where else f"{exc} (check that "
                                       f"{path.parent} and the file are readable and writable)"))
    if primary == sqlite3.SQLITE_IOERR and _log_deleted(path):
        return DatabaseRefusedError(
            f"the job database at {path} cannot be read: its write-ahead log {_wal(path)} was deleted while a "
            f"process had the database open, and its index {path}-shm still counts the log's pages; stop every "
            f"process using the database (a worker stops by itself and copies that log back as it closes), then "
            f"try again")
    return None


def _wal(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def _log_deleted(path: Path) -> bool:
    """The write-ahead log is shorter than its index (`-shm`) says: deleted under a live connection.

    The index begins with SQLite's WAL index header, in the host's byte order: the page size (a u16 at
    byte 14, 1 meaning 65536) and the frames in the log (a u32 at byte 16); a frame is a 24-byte header and a
    page, after the log's 32-byte header.
    """
    try:
        header = path.with_name(path.name + "-shm").read_bytes()[:20]
        wal_size = _wal(path).stat().st_size if _wal(path).exists() else 0
    except OSError:
        return False
    if len(header) < 20:
        return False
    page = int.from_bytes(header[14:16], sys.byteorder) or 0
    page = 65536 if page == 1 else page
    frames = int.from_bytes(header[16:20], sys.byteorder)
    return frames > 0 and wal_size < 32 + frames * (24 + page)


def _read_only_media(path: Path) -> bool:
    """Whether the database's folder is on a read-only filesystem."""
    try:
        return bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _why_read_only(path: Path) -> str:
    if _read_only_media(path):
        return f"{path.parent} is on a read-only filesystem"
    return f"the file or its folder {path.parent} is not writable for this user"


def connect(
    path: str | Path, *, check_same_thread: bool = True, durable: bool = False, read_only: bool = False,
    lock_wait: LockWait | None = None,
) -> sqlite_utils.Database:
    """Open (creating if needed) the database at `path` with WAL and a busy timeout; the schema is not
    touched (the product opens its database with `storage.schema.open_database`, which migrates).

    The connection is in autocommit mode: multi-statement writes open their own
    `BEGIN IMMEDIATE` transaction (see `transaction`). `check_same_thread=False`
    is for callers that guard the connection with their own lock. `durable`
    fsyncs at every commit (see the module docstring). `read_only` opens an
    existing file without writing anything to it. With `lock_wait`, a statement
    refused for another process's lock is retried until it goes through
    (`storage.lock_waits.RetryingConnection`), each try waiting `RETRY_AFTER_MS`.
    """
    path = Path(path)
    if read_only:
        return sqlite_utils.Database(_open_read_only(path, check_same_thread))
    if not path.parent.is_dir():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DatabaseRefusedError(f"the job database at {path} cannot be created: its folder {path.parent} "
                                       f"cannot be made ({e.strerror})") from None
    try:
        conn = sqlite3.connect(str(path), timeout=OPEN_TIMEOUT_MS / 1000, isolation_level=None,
                               check_same_thread=check_same_thread,
                               factory=RetryingConnection if lock_wait else sqlite3.Connection)
    except sqlite3.Error as e:
        raise refusal_error(e, path) or e from None
    try:
        _open(conn, path)
        if lock_wait is not None:
            conn.lock_wait = lock_wait
        conn.execute(f"PRAGMA busy_timeout = {RETRY_AFTER_MS if lock_wait else BUSY_TIMEOUT_MS}")
        conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        conn.execute("PRAGMA foreign_keys = ON")
    except BaseException as e:
        conn.close()
        refused = refusal_error(e, path)
        if refused is not None:
            raise refused from None
        raise
    return sqlite_utils.Database(conn)


def _open_read_only(path: Path, check_same_thread: bool) -> sqlite3.Connection:
    """The existing file at `path` opened read-only (`immutable` on read-only media, where no `-shm` index can
    be created and nothing can write the file); a refusal is `DatabaseRefusedError`."""
    if not path.is_file() and not path.is_dir():
        raise DatabaseRefusedError(f"the job database at {path} does not exist")
    uri = f"file:{quote(str(path))}?mode=ro"
    if _read_only_media(path) and not path.with_name(path.name + "-shm").exists():
        uri += "&immutable=1"
    conn = None
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=OPEN_TIMEOUT_MS / 1000, isolation_level=None,
                               check_same_thread=check_same_thread)
        conn.execute("PRAGMA user_version")
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    except sqlite3.Error as e:
        if conn is not None:
            conn.close()
        raise refusal_error(e, path) or DatabaseRefusedError(f"the job database at {path} cannot be read: {e}") \
            from None
    return conn


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
