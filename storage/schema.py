"""Table definitions, the schema version and forward migrations.

The version lives in `PRAGMA user_version`. Each migration is a list of SQL
statements that moves the schema from version i to i+1; `ensure_schema` runs
the missing ones in one write transaction, so two processes starting at once
never migrate twice. `open_database` is how the product opens its database:
`connections.connect`, then `ensure_schema`.
"""

from __future__ import annotations

from pathlib import Path

import sqlite_utils

from core.errors import DrainboardError
from storage.connections import connect, refusal_error, transaction
from storage.lock_waits import LockWait

SAMPLE_COLUMNS = (
    "job_id", "seq", "rank", "t", "stage", "tensors_placed", "bytes_placed", "tensor_name",
    "vm_rss", "rss_anon", "rss_file", "vm_hwm", "mem_available",
    "device_allocated", "device_reserved", "cgroup_usage",
)
"""Column order of `samples` (docs/architecture.md); every size in bytes."""

JOB_STATUSES = ("queued", "running", "succeeded", "failed", "killed", "cancelled", "interrupted")
"""Every status a job can have; the last five are final."""

FINAL_STATUSES = frozenset(JOB_STATUSES[2:])

EXTREME_COLUMNS = SAMPLE_COLUMNS[8:]
"""Size columns whose per-block extremes `sample_extremes` keeps (every size column of a sample)."""

EXTREMES_BLOCK = 32
"""Samples per block of `sample_extremes`: the finest resolution of a downsampled long series."""


def _extremes_backfill() -> list[str]:
    """Statements that fill `sample_extremes` from samples already stored (migration 2)."""
    statements = []
    for column in EXTREME_COLUMNS:
        block = f"seq / {EXTREMES_BLOCK}"
        # A lone min()/max() makes SQLite return the seq of the row holding it.
        statements.append(
            f"INSERT INTO sample_extremes (job_id, rank, col, block, lo, lo_seq, hi, hi_seq) "
            f"SELECT job_id, rank, '{column}', {block}, min({column}), seq, NULL, NULL FROM samples "
            f"WHERE {column} IS NOT NULL GROUP BY job_id, rank, {block}"
        )
        statements.append(
            f"UPDATE sample_extremes SET (hi, hi_seq) = (SELECT max({column}), seq FROM samples s "
            f"WHERE s.job_id = sample_extremes.job_id AND s.rank = sample_extremes.rank "
            f"AND s.seq BETWEEN sample_extremes.block * {EXTREMES_BLOCK} AND sample_extremes.block * {EXTREMES_BLOCK} + "
            f"{EXTREMES_BLOCK - 1} AND {column} IS NOT NULL) WHERE col = '{column}'"
        )
    return statements


_MIGRATIONS: list[list[str]] = [
    # 1: the initial schema.
    [
        """CREATE TABLE jobs (
            id INTEGER PRIMARY KEY,
            kind TEXT NOT NULL,
            spec TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'queued',
            created_at REAL NOT NULL,
            started_at REAL,
            finished_at REAL,
            pid INTEGER,
            supervisor_id TEXT,
            exit_code INTEGER,
            signal TEXT,
            error TEXT,
            stage TEXT,
            progress_done INTEGER,
            progress_total INTEGER,
            metrics TEXT,
            retry_of INTEGER REFERENCES jobs(id),
            cancel_requested INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX jobs_status ON jobs(status, id)",
        """CREATE TABLE samples (
            job_id INTEGER NOT NULL,
            seq INTEGER NOT NULL,
            rank INTEGER NOT NULL DEFAULT 0,
            t REAL NOT NULL,
            stage TEXT,
            tensors_placed INTEGER,
            bytes_placed INTEGER,
            tensor_name TEXT,
            vm_rss INTEGER,
            rss_anon INTEGER,
            rss_file INTEGER,
            vm_hwm INTEGER,
            mem_available INTEGER,
            device_allocated INTEGER,
            device_reserved INTEGER,
            cgroup_usage INTEGER,
            PRIMARY KEY (job_id, rank, seq)
        ) WITHOUT ROWID""",
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY,
            job_id INTEGER NOT NULL,
            t REAL NOT NULL,
            created_at REAL NOT NULL,
            kind TEXT NOT NULL,
            stage TEXT,
            message TEXT NOT NULL,
            data TEXT
        )""",
        "CREATE INDEX events_job ON events(job_id, id)",
        """CREATE TABLE artifacts (
            id INTEGER PRIMARY KEY,
            job_id INTEGER NOT NULL,
            name TEXT NOT NULL,
            size INTEGER NOT NULL,
            media_type TEXT NOT NULL,
            created_at REAL NOT NULL,
            UNIQUE (job_id, name)
        )""",
        """CREATE TABLE supervisors (
            id TEXT PRIMARY KEY,
            pid INTEGER NOT NULL,
            host TEXT NOT NULL,
            started_at REAL NOT NULL,
            heartbeat_at REAL NOT NULL,
            current_job INTEGER,
            stopped_at REAL
        )""",
    ],
    # 2: per-block extremes of every size column, kept by the sample writer, so a
    # long series downsamples from a few thousand block rows instead of every sample.
    [
        """CREATE TABLE sample_extremes (
            job_id INTEGER NOT NULL,
            rank INTEGER NOT NULL,
            col TEXT NOT NULL,
            block INTEGER NOT NULL,
            lo INTEGER,
            lo_seq INTEGER,
            hi INTEGER,
            hi_seq INTEGER,
            PRIMARY KEY (job_id, rank, col, block)
        ) WITHOUT ROWID""",
        *_extremes_backfill(),
    ],
    # 3: liveness and outcomes. A running job's own heartbeat (every live
    # supervisor recovers a job whose heartbeat stops), the boot it runs under
    # (a host restart ends it interrupted), its child's start time (a recycled
    # pid is never taken for the child), and an error's full text beside its
    # one-line summary.
    [
        "ALTER TABLE jobs ADD COLUMN heartbeat_at REAL",
        "ALTER TABLE jobs ADD COLUMN boot_id TEXT",
        "ALTER TABLE jobs ADD COLUMN pid_start INTEGER",
        "ALTER TABLE jobs ADD COLUMN error_detail TEXT",
        "ALTER TABLE supervisors ADD COLUMN boot_id TEXT",
    ],
    # 4: a queued job's place in the queue. NULL keeps submission order (its id); moving a job to the front
    # gives it a place before every other queued job's (storage.jobs_table.QUEUE_ORDER).
    [
        "ALTER TABLE jobs ADD COLUMN queue_rank REAL",
    ],
]

SCHEMA_VERSION = len(_MIGRATIONS)


class SchemaError(DrainboardError):
    """The database was written by a newer Drainboard than this one."""


def schema_version(db: sqlite_utils.Database) -> int:
    return db.execute("PRAGMA user_version").fetchone()[0]


def _too_new(version: int) -> SchemaError:
    return SchemaError(f"database schema version {version} is newer than this Drainboard ({SCHEMA_VERSION}); "
                       f"upgrade Drainboard")


def ensure_schema(db: sqlite_utils.Database) -> int:
    """Create or migrate the schema to `SCHEMA_VERSION`; safe to call any number of times.

    Returns the version now in place. A database from a newer Drainboard is
    refused rather than touched.
    """
    if schema_version(db) == SCHEMA_VERSION:
        return SCHEMA_VERSION
    with transaction(db) as conn:
        current = schema_version(db)
        if current > SCHEMA_VERSION:
            raise _too_new(current)
        for version in range(current, SCHEMA_VERSION):
            for statement in _MIGRATIONS[version]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
    return SCHEMA_VERSION


def open_database(path: str | Path, *, check_same_thread: bool = True, durable: bool = False,
                  lock_wait: LockWait | None = None) -> sqlite_utils.Database:
    """`connect(path, ...)` with the schema created or migrated (`ensure_schema`): what every part that
    writes the job database opens. A refusal met while migrating (garbage, read-only media) is one line
    naming the file (`refusal_error`)."""
    db = connect(path, check_same_thread=check_same_thread, durable=durable, lock_wait=lock_wait)
    try:
        ensure_schema(db)
    except BaseException as e:
        db.conn.close()
        refused = refusal_error(e, path)
        if refused is not None:
            raise refused from e
        raise
    return db


def open_for_reading(path: str | Path) -> sqlite_utils.Database:
    """The database opened for reads only (`connect(read_only=True)`: it works on read-only media). A file
    of an older schema, or none yet, is opened as `open_database` does, since it must be written first."""
    path = Path(path)
    if not path.exists():
        return open_database(path)
    db = connect(path, read_only=True)
    try:
        version = schema_version(db)
    except BaseException as e:
        db.conn.close()
        raise refusal_error(e, path) or e from None
    if version > SCHEMA_VERSION:
        db.conn.close()
        raise _too_new(version)
    if version < SCHEMA_VERSION:
        db.conn.close()
        return open_database(path)
    return db
