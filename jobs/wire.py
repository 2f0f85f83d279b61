"""The line protocol of a job child that cannot reach the database: tagged JSON lines on stdout.

A child on another machine (the Ray backend, `jobs.backends.ray_jobs`) writes
everything it would write to SQLite as one line each, `@drainboard ["kind", payload]\n`,
among whatever else it prints (which becomes the job's child log). The supervisor
follows the job's log and applies each tagged line to the same tables
(`jobs.backends.follow`), so every page reads a Ray job like a local one.

Kinds of line, in the order a job sends them:
- `start` {pid, host}: the child runs (on `host`);
- `t0` float: the child's start on its monotonic clock (sample times are relative to it);
- `sample` list: one `jobs.samples.sample_message`;
- `event` {t, created_at, kind, stage, message, data}, `stage` name, `progress` [done, total];
- `artifact` {name, size}, `chunk` {name, data: base64}, `artifact_end` {name, sha256}: a file sent back;
- `guard` {t, message, data}: the memory guard, run by the child on its node, stopped the job;
- `metrics` dict, `error` [summary, detail];
- `exit` code: the child's exit code, written last.

Lines are written with one `os.write` each under a lock, so the sampler thread and the job's
thread never interleave; the tag is searched anywhere in a line, so output a library left
without a newline does not hide it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any, Callable

from jobs.guard import GuardTrip
from jobs.samples import sample_message
from core.errors import DrainboardError
from machine.memory import MemorySample
from core.sizes import format_size

TAG = "@drainboard "
ENV_REPORT = "DRAINBOARD_REPORT"
"""`stdout`: the child reports over this protocol instead of the database (set by the Ray backend)."""
ENV_SPEC = "DRAINBOARD_JOB_SPEC"
"""The job's spec as JSON, for a child with no database to read it from."""
CHUNK_BYTES = 192 * 1024
"""Raw bytes per `chunk` line (256 KiB of base64)."""
TRANSFER_LIMIT = 4 * 2**30
"""The largest artifact sent back over the log; a larger one fails the job, naming it, rather than being lost."""


class TransferError(DrainboardError):
    """An artifact cannot travel over the log (too large)."""


def encode(kind: str, payload: Any) -> bytes:
    """One tagged line."""
    return (TAG + json.dumps([kind, payload], separators=(",", ":")) + "\n").encode()


def decode(line: str) -> tuple[str, Any] | None:
    """(kind, payload) of a tagged line; None for any other line (child output) or a line cut short by a kill."""
    at = line.find(TAG)
    if at < 0:
        return None
    try:
        kind, payload = json.loads(line[at + len(TAG):])
    except (ValueError, TypeError):
        return None
    return (kind, payload) if isinstance(kind, str) else None


class LineWriter:
    """Writes tagged lines to a duplicate of stdout (kinds that swap `sys.stdout` do not redirect it)."""

    def __init__(self, fd: int = 1):
        self._fd = os.dup(fd)
        self._lock = threading.Lock()

    def send(self, kind: str, payload: Any) -> None:
        line = encode(kind, payload)
        with self._lock:
            if self._fd is None:
                raise RuntimeError("the job's report line is closed")
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view):]

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class StdoutSink:
    """A `jobs.samples.SampleSink` that sends each sample as a `sample` line (after one `t0` line)."""

    def __init__(self, writer: LineWriter, *, t0: float):
        self._writer = writer
        writer.send("t0", t0)

    def add(self, sample: MemorySample, *, rank: int = 0, **tags) -> None:
        self._writer.send("sample", sample_message(sample, rank=rank, **tags))

    def flush(self) -> None:
        """Nothing to do: every sample left the process when it was added."""

    def close(self) -> None:
        """Nothing to do: the reporter owns the line."""


class StdoutReporter:
    """A `jobs.reporting.Reporter` over this protocol; the spec comes from `DRAINBOARD_JOB_SPEC`."""

    remote = True

    def __init__(self, job_id: int, writer: LineWriter | None = None, environ: dict[str, str] | None = None):
        self.job_id = job_id
        self._environ = os.environ if environ is None else environ
        self._writer = writer or LineWriter()
        self._writer.send("start", {"pid": os.getpid(), "host": socket.gethostname()})

    def spec(self) -> dict[str, Any] | None:
        raw = self._environ.get(ENV_SPEC)
        return None if raw is None else json.loads(raw)

    def sample_sink(self, t0: float, clock: Callable[[], float]) -> StdoutSink:
        return StdoutSink(self._writer, t0=t0)

    def event(self, row: dict[str, Any]) -> None:
        self._writer.send("event", row)

    def stage(self, name: str) -> None:
        self._writer.send("stage", name)

    def progress(self, done: int, total: int | None) -> None:
        self._writer.send("progress", [done, total])

    def artifact(self, path: Path) -> None:
        path = Path(path)
        size = path.stat().st_size
        if size > TRANSFER_LIMIT:
            raise TransferError(f"{path.name}: {format_size(size)} is more than the {format_size(TRANSFER_LIMIT)} "
                                f"a Ray job sends back over its log")
        self._writer.send("artifact", {"name": path.name, "size": size})
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK_BYTES):
                digest.update(chunk)
                self._writer.send("chunk", {"name": path.name, "data": base64.b64encode(chunk).decode()})
        self._writer.send("artifact_end", {"name": path.name, "sha256": digest.hexdigest()})

    def metrics(self, metrics: dict[str, Any]) -> None:
        self._writer.send("metrics", metrics)

    def error(self, summary: str, detail: str | None) -> None:
        self._writer.send("error", [summary, detail])

    def guard(self, trip: GuardTrip, t: float) -> None:
        """The memory guard on the child's node stopped the job at `t` s."""
        self._writer.send("guard", {"t": t, "message": trip.message, "data": trip.to_dict()})

    def exit(self, code: int) -> None:
        """The child's last line: its exit code."""
        self._writer.send("exit", code)

    def close(self) -> None:
        """Nothing to do: the line stays open for `exit`."""
