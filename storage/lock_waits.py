"""Waiting out another process's write lock instead of dying of it.

SQLite lets one writer in at a time; a statement meeting another's lock waits
the busy timeout, then fails "database is locked". A process holding the lock
longer (an open `BEGIN IMMEDIATE`, a long import, a backup tool) once killed
the worker that way and left its job `running`. The writers that must not
lose anything (the supervisor, the sample writer, a job child) open a
`RetryingConnection`: a statement refused for a lock is tried again, with a
growing pause, for as long as the lock is held. Only a statement that changed
nothing is retried: one outside a transaction, or the `BEGIN` that starts one,
and every `BEGIN` such a connection runs takes the write lock at once (`BEGIN
IMMEDIATE`), so the statements inside a transaction never meet another's lock.

A `LockWait` is what a process knows of its waits: since when it has been
refused, and the waits that ended (the supervisor turns those into job events).
With a `notice` path it also writes the wait to that file while it lasts
(`read_lock_notice`): the database cannot take the news, the System page reads
the file.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

RETRY_AFTER_MS = 5_000
"""The busy timeout of a retrying connection: how long one try waits for the lock before the wait is said."""
LONGEST_PAUSE = 2.0
"""Seconds between tries at most (the pause doubles from 0.05 s)."""


def is_database_locked(exc: BaseException) -> bool:
    """True for SQLite's "database is locked" (SQLITE_BUSY and its variants), however the statement was run."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and code is not None and code & 0xFF == sqlite3.SQLITE_BUSY


def lock_notice_path(db_path: str | Path) -> Path:
    """The file beside the database that says a worker is waiting for its lock."""
    db_path = Path(db_path)
    return db_path.with_name(db_path.name + ".locked")


@dataclass(frozen=True)
class LockNotice:
    """A wait in progress, as its notice file tells it: since when (epoch seconds), who waits (and its pid)."""

    since: float
    owner: str
    pid: int


def read_lock_notice(db_path: str | Path) -> LockNotice | None:
    """The wait a worker is in for the database at `db_path`, or None (no notice, or one left by a process
    that is gone)."""
    try:
        raw = json.loads(lock_notice_path(db_path).read_text())
        notice = LockNotice(float(raw["since"]), str(raw["owner"]), int(raw["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(notice.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return notice


@dataclass(frozen=True)
class LockSpell:
    """One wait that ended: from `since` to `until` (epoch seconds)."""

    since: float
    until: float

    @property
    def seconds(self) -> float:
        return self.until - self.since


class LockWait:
    """A process's waits for the database lock, shared by its retrying connections (thread-safe).

    `owner` names the process in its notice; `notice` is the notice file (None: none written).
    """

    def __init__(self, owner: str = "", notice: Path | None = None, *, clock: Callable[[], float] = time.time):
        self.owner = owner
        self.notice = notice
        self._clock = clock
        self._lock = threading.Lock()
        self._waiters = 0
        self.since: float | None = None
        """When the current wait began (the first refused try's start), None when nobody waits."""
        self.last_cleared: float | None = None
        """When the last wait ended."""
        self._ended: list[LockSpell] = []

    def refused(self, tried_at: float) -> None:
        """A try begun at `tried_at` was refused for the lock (the first of a wait writes the notice)."""
        with self._lock:
            if self.since is not None:
                return
            self.since = tried_at
            if self.notice is not None:
                _write_notice(self.notice, {"since": tried_at, "owner": self.owner, "pid": os.getpid()})

    def begin(self) -> None:
        with self._lock:
            self._waiters += 1

    def end(self, waited: bool) -> None:
        """A retrying statement went through (or gave up); the wait ends with the last waiter."""
        with self._lock:
            self._waiters -= 1
            if not waited or self._waiters > 0 or self.since is None:
                return
            now = self._clock()
            self._ended.append(LockSpell(self.since, now))
            self.since, self.last_cleared = None, now
            if self.notice is not None:
                self.notice.unlink(missing_ok=True)

    def take_ended(self) -> list[LockSpell]:
        """The waits that ended since the last call."""
        with self._lock:
            ended, self._ended = self._ended, []
        return ended

    def waited_within(self, seconds: float, now: float) -> bool:
        """Whether this process was waiting for the lock in the last `seconds` (its view of others'
        heartbeats is then no evidence: nobody could write them)."""
        with self._lock:
            return self.since is not None or (self.last_cleared is not None and now - self.last_cleared < seconds)


def _write_notice(path: Path, content: dict) -> None:
    """The notice, written whole (a reader never sees half of it); a folder that refuses it loses only the notice."""
    partial = path.with_name(path.name + ".part")
    try:
        partial.write_text(json.dumps(content))
        partial.replace(path)
    except OSError:
        partial.unlink(missing_ok=True)


class RetryingConnection(sqlite3.Connection):
    """A connection whose statements refused for another process's lock are tried again until they go through.

    `sqlite3.connect(..., factory=RetryingConnection)`, then set `lock_wait` (until then nothing is retried:
    opening says a lock at once). Every `BEGIN` runs as `BEGIN IMMEDIATE` (see the module docstring); a
    statement inside a transaction is never retried.
    """

    lock_wait: LockWait | None = None

    def execute(self, sql: str, parameters=(), /) -> sqlite3.Cursor:
        if sql.strip().upper() == "BEGIN":
            sql = "BEGIN IMMEDIATE"
        return self._retried(super().execute, sql, parameters)

    def executemany(self, sql: str, parameters, /) -> sqlite3.Cursor:
        return self._retried(super().executemany, sql, parameters)

    def _retried(self, run, sql: str, parameters) -> sqlite3.Cursor:
        wait = self.lock_wait
        if wait is None:
            return run(sql, parameters)
        pause, waited = 0.05, False
        wait.begin()
        try:
            while True:
                tried_at = time.time()
                try:
                    return run(sql, parameters)
                except sqlite3.OperationalError as e:
                    if self.in_transaction or not is_database_locked(e):
                        raise
                    wait.refused(tried_at)
                    waited = True
                time.sleep(pause)
                pause = min(pause * 2, LONGEST_PAUSE)
        finally:
            wait.end(waited)
