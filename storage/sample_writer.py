"""The one writer of the `samples` and `sample_extremes` tables: memory samples, batched, used by the job child.

Sampling every placed tensor must cost little, so samples are buffered and
written in one transaction per batch (with the per-block extremes that the
downsampled series reads, see `storage.queries.sample_series`): when `batch_size` are waiting, when
`flush_interval` seconds have passed (a background thread checks, so a quiet
stage still shows up live), and at `close()` or interpreter exit. Each batch
is fsynced (a `durable` connection), so a host that freezes or loses power
keeps the samples up to the last `flush_interval`. Another process holding the
write lock makes a batch wait, retried, never lost (`storage.lock_waits`).
Every row reaches the tables through `append_samples`, so a block's extremes
always agree with its samples; `tests/storage/test_table_owners.py` fails when
code elsewhere writes either table.
"""

from __future__ import annotations

import atexit
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable

import sqlite_utils

from machine.memory import MemorySample
from storage.connections import is_database_full, transaction
from storage.lock_waits import LockWait
from storage.schema import EXTREME_COLUMNS, EXTREMES_BLOCK, SAMPLE_COLUMNS, open_database

_INSERT = f"INSERT INTO samples ({', '.join(SAMPLE_COLUMNS)}) VALUES ({', '.join('?' * len(SAMPLE_COLUMNS))})"

# A block's extremes may come from several batches: keep whichever end is more extreme.
# (SQLite evaluates every SET expression against the row as it was.)
_UPSERT_EXTREMES = """INSERT INTO sample_extremes (job_id, rank, col, block, lo, lo_seq, hi, hi_seq)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (job_id, rank, col, block) DO UPDATE SET
        lo_seq = CASE WHEN excluded.lo < lo THEN excluded.lo_seq ELSE lo_seq END,
        lo = min(lo, excluded.lo),
        hi_seq = CASE WHEN excluded.hi > hi THEN excluded.hi_seq ELSE hi_seq END,
        hi = max(hi, excluded.hi)"""

_EXTREME_INDEXES = tuple((SAMPLE_COLUMNS.index(c), c) for c in EXTREME_COLUMNS)
_SEQ = SAMPLE_COLUMNS.index("seq")


def block_extremes(job_id: int, rank: int, rows: list[tuple]) -> list[tuple]:
    """`sample_extremes` rows (min and max with their seq, per block and column) of a batch of sample rows."""
    blocks: dict[tuple[int, str], list] = {}
    for row in rows:
        seq = row[_SEQ]
        block = seq // EXTREMES_BLOCK
        for index, column in _EXTREME_INDEXES:
            value = row[index]
            if value is None:
                continue
            ext = blocks.get((block, column))
            if ext is None:
                blocks[(block, column)] = [value, seq, value, seq]
            elif value < ext[0]:
                ext[0], ext[1] = value, seq
            elif value > ext[2]:
                ext[2], ext[3] = value, seq
    return [(job_id, rank, column, block, *ext) for (block, column), ext in blocks.items()]


def sample_row(**columns) -> tuple:
    """A `samples` row in `SAMPLE_COLUMNS` order from column values by name (the others None)."""
    unknown = set(columns) - set(SAMPLE_COLUMNS)
    if unknown:
        raise ValueError(f"not sample columns: {', '.join(sorted(unknown))}")
    return tuple(columns.get(name) for name in SAMPLE_COLUMNS)


def append_samples(db: sqlite_utils.Database, job_id: int, rank: int, rows: list[tuple]) -> None:
    """Append sample rows (`SAMPLE_COLUMNS` order) of one job and rank with their blocks' extremes, in one
    `BEGIN IMMEDIATE` transaction."""
    extremes = block_extremes(job_id, rank, rows)
    with transaction(db) as conn:
        conn.executemany(_INSERT, rows)
        conn.executemany(_UPSERT_EXTREMES, extremes)


class SampleWriter:
    """Appends samples of one job (and one rank) to the database at `db_path`.

    `t0` is the job's start on the samples' clock (`MemorySample.t`); stored
    `t` is seconds since then. Thread-safe: the periodic sampler's thread and
    the job's thread may both call `add`. `durable=False` skips the fsync per
    batch (for benchmarks comparing the two). `lock_wait` is the process's record
    of its waits for another writer's lock (a fresh one by default).
    """

    def __init__(
        self,
        db_path: str | Path,
        job_id: int,
        *,
        t0: float,
        rank: int = 0,
        batch_size: int = 256,
        flush_interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        durable: bool = True,
        lock_wait: LockWait | None = None,
    ):
        self.job_id = job_id
        self.rank = rank
        self._t0 = t0
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._clock = clock
        self._db = open_database(db_path, check_same_thread=False, durable=durable, lock_wait=lock_wait or LockWait())
        last = self._db.execute(
            "SELECT max(seq) FROM samples WHERE job_id = ? AND rank = ?", [job_id, rank]
        ).fetchone()[0]
        self._next_seq = 0 if last is None else last + 1
        self._pending: list[tuple] = []
        self._lock = threading.Lock()
        self._last_flush = clock()
        self._closed = False
        self.written = 0
        """Samples committed so far."""
        self.last: dict | None = None
        """The most recent sample added, as a row dict (what a crash report quotes)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._flush_periodically, name="drainboard-sample-flush", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def add(
        self,
        sample: MemorySample,
        *,
        stage: str | None = None,
        tensors_placed: int | None = None,
        bytes_placed: int | None = None,
        tensor_name: str | None = None,
    ) -> None:
        """Buffer one sample; writes the batch when it is full or old enough."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"sample writer of job {self.job_id} is closed")
            row = (
                self.job_id, self._next_seq, self.rank, sample.t - self._t0, stage, tensors_placed, bytes_placed,
                tensor_name, sample.vm_rss, sample.rss_anon, sample.rss_file, sample.vm_hwm, sample.mem_available,
                sample.device_allocated, sample.device_reserved, sample.cgroup_usage,
            )
            self._next_seq += 1
            self._pending.append(row)
            self.last = dict(zip(SAMPLE_COLUMNS, row))
            if len(self._pending) >= self._batch_size or self._clock() - self._last_flush >= self._flush_interval:
                self._flush_locked()

    def flush(self) -> None:
        """Write every buffered sample now."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        self._last_flush = self._clock()
        if not self._pending:
            return
        append_samples(self._db, self.job_id, self.rank, self._pending)
        self.written += len(self._pending)
        self._pending.clear()

    def discard(self) -> None:
        """Drop the buffered samples and stop writing (what the database refused for lack of room)."""
        with self._lock:
            self._pending.clear()
            self._closed = True
        self._stop.set()
        self._db.conn.close()

    def _flush_periodically(self) -> None:
        while not self._stop.wait(self._flush_interval):
            with self._lock:
                if not self._closed and self._clock() - self._last_flush >= self._flush_interval:
                    try:
                        self._flush_locked()
                    except sqlite3.Error as e:
                        if not is_database_full(e):
                            raise
                        # The batch stays pending: the next add, flush or close retries it and raises.

    def close(self) -> None:
        """Flush what is left and release the connection; safe to call twice.

        A flush that fails (a full disk) still closes the writer, then raises.
        """
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        atexit.unregister(self.close)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._flush_locked()
            finally:
                self._db.conn.close()

    def __enter__(self) -> "SampleWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
