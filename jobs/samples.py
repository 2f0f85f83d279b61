"""How a job's memory samples travel from its child process to the database.

Under a supervisor the child writes each sample, as one JSON line, to a pipe
the supervisor reads (`PipeSink` -> `SampleRelay`). A write to a pipe leaves
the child at once, so a child killed by SIGKILL loses nothing: the kernel
keeps what it wrote, and the relay drains the pipe to its end before the
supervisor quotes the last sample. Run on its own (`python -m jobs.child ID`
by hand, or in a test), the child writes to the database itself (`DatabaseSink`).
Either way the database side is a `SampleWriter` per rank (batched, fsynced).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Callable, Protocol

from core.diskspace import free_bytes
from core.errors import DiskFullError
from machine.memory import MemorySample
from storage.connections import is_database_full
from storage.lock_waits import LockWait
from storage.sample_writer import SampleWriter

ENV_SAMPLE_FD = "DRAINBOARD_SAMPLE_FD"
"""Set by the supervisor: the child's end of the sample pipe."""

ROOM_KEPT = 256 * 1024
"""Bytes the relay leaves free on the database's disk: below this it stops storing samples, so the
job's end (a few pages) can still be recorded."""

PIPE_SIZE = 1 << 20
"""Bytes the pipe may hold (Linux's default cap, /proc/sys/fs/pipe-max-size), so a busy relay never stalls a load."""
_F_SETPIPE_SZ = 1031


class SampleSink(Protocol):
    """Where a job context sends its samples."""

    def add(self, sample: MemorySample, *, rank: int, stage: str | None, tensors_placed: int | None,
            bytes_placed: int | None, tensor_name: str | None) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class DatabaseSink:
    """Writes samples straight to the database: one `SampleWriter` per rank, opened on its first sample."""

    def __init__(self, db_path: str | Path, job_id: int, *, t0: float, clock):
        self._db_path, self._job_id, self._t0, self._clock = db_path, job_id, t0, clock
        self._writers: dict[int, SampleWriter] = {}
        self._lock = threading.Lock()

    def _writer(self, rank: int) -> SampleWriter:
        with self._lock:
            writer = self._writers.get(rank)
            if writer is None:
                writer = self._writers[rank] = SampleWriter(self._db_path, self._job_id, t0=self._t0, rank=rank,
                                                            clock=self._clock)
            return writer

    def add(self, sample: MemorySample, *, rank: int = 0, **tags) -> None:
        self._writer(rank).add(sample, **tags)

    def flush(self) -> None:
        for writer in list(self._writers.values()):
            writer.flush()

    def close(self) -> None:
        for writer in list(self._writers.values()):
            writer.close()


def sample_message(sample: MemorySample, *, rank: int = 0, stage: str | None = None,
                   tensors_placed: int | None = None, bytes_placed: int | None = None,
                   tensor_name: str | None = None) -> list:
    """A sample as it travels: rank, stage, tensors_placed, bytes_placed, tensor_name, then the
    `MemorySample` fields in order (a list, not a dict: `dataclasses.asdict` would cost more than the write)."""
    return [rank, stage, tensors_placed, bytes_placed, tensor_name, sample.t, sample.vm_rss, sample.rss_anon,
            sample.rss_file, sample.vm_hwm, sample.mem_available, sample.device_allocated,
            sample.device_reserved, sample.cgroup_usage]


class SampleStore:
    """The receiving end's writers: one `SampleWriter` per rank, fed `sample_message` lists.

    Used by the pipe's relay and by the Ray backend's log follower. `last` is the newest sample stored
    (a row dict, as `storage.queries.last_sample` returns). Below `ROOM_KEPT` bytes free it refuses
    (DiskFullError), so the job's end can still be recorded.
    """

    def __init__(self, db_path: str | Path, job_id: int, t0: float, lock_wait: LockWait | None = None):
        self._db_path, self._job_id, self._t0, self._lock_wait = db_path, job_id, t0, lock_wait
        self._writers: dict[int, SampleWriter] = {}
        self.last: dict | None = None

    def add(self, message: list) -> None:
        free = free_bytes(self._db_path)
        if free < ROOM_KEPT:
            raise DiskFullError(f"disk full: {free:,} bytes free for {self._db_path}, below the "
                                f"{ROOM_KEPT:,} kept to record the job's end")
        rank, stage, tensors_placed, bytes_placed, tensor_name, *sample = message
        writer = self._writers.get(rank)
        if writer is None:
            writer = self._writers[rank] = SampleWriter(self._db_path, self._job_id, t0=self._t0, rank=rank,
                                                        lock_wait=self._lock_wait)
        writer.add(MemorySample(*sample), stage=stage, tensors_placed=tensors_placed, bytes_placed=bytes_placed,
                   tensor_name=tensor_name)
        self.last = writer.last

    def discard(self) -> None:
        """Drop what is buffered (a full disk: the little room left is for recording the job's end)."""
        for writer in self._writers.values():
            writer.discard()

    def close(self) -> BaseException | None:
        """Store what is buffered; returns the error of a database too full to take it, else None."""
        refused = None
        for writer in self._writers.values():
            try:
                writer.close()
            except Exception as e:  # noqa: BLE001
                if not is_database_full(e):
                    raise
                refused = refused or e
        return refused


class PipeSink:
    """Writes each sample (`sample_message`) as one JSON line to the supervisor's pipe (`fd`); the first
    line carries `t0`.

    A line is far below PIPE_BUF, so lines from the sampler thread and the job's thread never interleave.
    """

    def __init__(self, fd: int, *, t0: float):
        os.set_inheritable(fd, False)  # processes the job starts (torchrun ranks) must not hold the pipe open
        self._fd = fd
        self._lock = threading.Lock()
        self._write({"t0": t0})

    def _write(self, message: dict | list) -> None:
        line = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._fd is None:
                raise RuntimeError("the sample pipe is closed")
            os.write(self._fd, line)

    def add(self, sample: MemorySample, *, rank: int = 0, **tags) -> None:
        self._write(sample_message(sample, rank=rank, **tags))

    def flush(self) -> None:
        """Nothing to do: every sample left the process when it was added."""

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def open_sample_pipe() -> tuple[int, int]:
    """A (read end, write end) pair sized `PIPE_SIZE`; the write end is for the child (inheritable)."""
    read_fd, write_fd = os.pipe()
    try:
        import fcntl

        fcntl.fcntl(write_fd, _F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass  # a lower pipe-max-size: the default 64 KiB still works, the relay reads continuously
    os.set_inheritable(write_fd, True)
    return read_fd, write_fd


class SampleRelay:
    """The supervisor's end of one job's sample pipe: a thread that stores every line it reads.

    `last` is the newest sample received (a row dict, as `storage.queries.last_sample` returns);
    `t0` the child's start on the monotonic clock (shared by every process). A database that
    refuses the samples (disk full) sets `error`; the relay then keeps reading, and drops them,
    so the child never blocks on a full pipe. `on_start` is called when the child reports its start.
    `lock_wait`: the supervisor's record of its waits for another process's lock (the writes wait it out).
    """

    def __init__(self, db_path: str | Path, job_id: int, read_fd: int, *, on_start: Callable[[], None] | None = None,
                 lock_wait: LockWait | None = None):
        self._db_path, self._job_id, self._lock_wait = db_path, job_id, lock_wait
        self._on_start = on_start
        self._file = os.fdopen(read_fd, "rb", buffering=1 << 16)
        self._store: SampleStore | None = None
        self.t0: float | None = None
        self.received = 0
        """Samples read from the pipe."""
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"drainboard-relay-{job_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for line in self._file:
            try:
                message = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill mid-write: nothing to keep
            if isinstance(message, dict) and "t0" in message:
                self.t0 = message["t0"]
                self._store = SampleStore(self._db_path, self._job_id, self.t0, self._lock_wait)
                if self._on_start is not None:
                    self._on_start()
                continue
            self.received += 1
            if self.error is not None or self._store is None:
                continue
            try:
                self._store.add(message)
            except Exception as e:  # noqa: BLE001 - the relay must keep draining whatever the database says
                self.error = e
                self._store.discard()

    @property
    def last(self) -> dict | None:
        """The newest sample stored (a row dict, as `storage.queries.last_sample` returns)."""
        return self._store.last if self._store is not None else None

    def close(self, timeout: float = 10.0) -> None:
        """Wait for the pipe's end (every writer gone), then store what is buffered.

        A database that refuses the last batch leaves `error` set rather than raising.
        """
        self._thread.join(timeout)
        if self._store is not None:
            self.error = self.error or self._store.close()
        self._file.close()
