"""The line protocol of a job child that cannot reach the database: records over a pipe of its own, tagged
lines in the job's log.

Under the Ray backend (`jobs.backends.ray_jobs`) a job runs as `python -m jobs.backends.node ID` on its
node. That relay starts the job child (`jobs.child`) and gives it a pipe for its records
(`DRAINBOARD_RECORD_FD`), apart from its stdout and stderr: the child writes everything it would write to
SQLite there, one JSON line `["kind", payload]` each (`LineWriter`). The relay writes each record to the
job's log as a tagged line, `@drainboard <job id> <nonce> ["kind", payload]`, and everything the child
printed as plain lines. The nonce is a secret the supervisor makes for each job and hands to the relay in
its environment (`DRAINBOARD_WIRE_NONCE`); the relay removes it before the child starts and never prints
it. The supervisor follows the log (`jobs.backends.follow`) and applies only lines that begin with its job's
tag, so nothing a job prints (a tensor name in a traceback, a prompt, an error text) passes for a record,
and no job writes another's rows.

Kinds of record, in the order a job sends them:
- `start` {pid, host}: the child runs (on `host`);
- `t0` float: the child's start on its monotonic clock (sample times are relative to it);
- `sample` list: one `jobs.samples.sample_message`;
- `event` {t, created_at, kind, stage, message, data}, `stage` name, `progress` [done, total];
- `artifact` {name, size}, `chunk` {name, data: base64}, `artifact_end` {name, sha256}: a file sent back;
- `guard` {t, message, data}: the memory guard, run by the child on its node, stopped the job;
- `metrics` dict, `error` [summary, detail];
- `part` [i, n, text]: piece i of n of one record longer than `LINE_LIMIT` (the text of `[kind, payload]`);
- `dropped` {limit}: the relay met a record line over `LINE_LIMIT` and dropped it (written by the relay);
- `exit` code: the child's exit code as `subprocess.Popen` gives it (negative: the signal that ended
  it), written last, by the relay.

Every line of the log is bounded (Ray's log tail refuses a message over 4 MiB and ends the stream): a
record over `LINE_LIMIT` travels as `part`s, one over `RECORD_LIMIT` is refused with `RecordTooLarge`
(an error's text is cut to fit instead), and the relay cuts a printed line at `OUTPUT_LINE_LIMIT`.
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
"""`wire`: the child reports over this protocol instead of the database (set by the Ray backend)."""
ENV_SPEC = "DRAINBOARD_JOB_SPEC"
"""The job's spec as JSON, for a child with no database to read it from."""
ENV_RECORD_FD = "DRAINBOARD_RECORD_FD"
"""The child's end of its record pipe, set by the relay on the node."""
ENV_NONCE = "DRAINBOARD_WIRE_NONCE"
"""The job's secret, in the relay's environment only: every tagged line carries it."""
LINE_LIMIT = 1 << 20
"""The longest record line (1 MiB, well under the 4 MiB message Ray's log tail takes)."""
RECORD_LIMIT = 64 << 20
"""The longest record sent in `part`s; a longer one is refused (`RecordTooLarge`)."""
OUTPUT_LINE_LIMIT = 64 << 10
"""The longest line of the child's own output the relay passes on; the rest of a longer line is cut."""
CHUNK_BYTES = 192 * 1024
"""Raw bytes per `chunk` line (256 KiB of base64)."""
TRANSFER_LIMIT = 4 * 2**30
"""The largest artifact sent back over the log; a larger one fails the job, naming it, rather than being lost."""
ERROR_TEXT_LIMIT = RECORD_LIMIT // 16
"""Characters of an error's detail kept (its start and end): an error is cut to fit, never refused."""


class TransferError(DrainboardError):
    """An artifact cannot travel over the log (too large)."""


class RecordTooLarge(DrainboardError):
    """A record is longer than the log carries (`RECORD_LIMIT`)."""


class BadRecord(ValueError):
    """A tagged line whose record is not one the protocol defines (bad JSON, unknown kind, wrong types)."""


def encode(kind: str, payload: Any) -> bytes:
    """One record as the child writes it: `["kind", payload]` and a newline (the relay adds the tag)."""
    return json.dumps([kind, payload], separators=(",", ":")).encode() + b"\n"


def record_lines(kind: str, payload: Any) -> list[bytes]:
    """The lines that carry one record: itself, or its text in `part`s when longer than `LINE_LIMIT`."""
    line = encode(kind, payload)
    if len(line) <= LINE_LIMIT:
        return [line]
    if len(line) > RECORD_LIMIT:
        raise RecordTooLarge(f"a {kind} record of {format_size(len(line))} is more than the "
                             f"{format_size(RECORD_LIMIT)} a Ray job's log carries")
    text = line[:-1].decode()
    piece = LINE_LIMIT // 4  # the text is ASCII JSON: escaped again, its quotes and backslashes at most double it
    pieces = [text[i:i + piece] for i in range(0, len(text), piece)]
    return [encode("part", [i, len(pieces), p]) for i, p in enumerate(pieces)]


def tag(job_id: int, nonce: str) -> str:
    """What begins every tagged line of job `job_id`."""
    return f"{TAG}{job_id} {nonce} "


def cut_text(text: str, limit: int) -> str:
    """`text` kept whole up to `limit` characters, else its start and end with what was cut said."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit // 2], text[-(limit // 4):]
    return f"{head}\n[... {len(text) - len(head) - len(tail):,} characters cut ...]\n{tail}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


MAX_RANK = 4096
"""The highest sample rank a record may name (a rank opens a writer)."""

_FIELDS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "start": {"pid": _is_int, "host": _is_str},
    "event": {"t": _is_number, "created_at": _is_number, "kind": _is_str, "stage": _optional(_is_str),
              "message": _is_str, "data": _optional(_is_str)},
    "guard": {"t": _is_number, "message": _is_str, "data": lambda v: isinstance(v, dict)},
    "artifact": {"name": _is_str, "size": lambda v: _is_int(v) and 0 <= v <= TRANSFER_LIMIT},
    "chunk": {"name": _is_str, "data": _is_str},
    "artifact_end": {"name": _is_str, "sha256": _is_str},
    "dropped": {"limit": _is_int},
}
_SAMPLE = [lambda v: _is_int(v) and 0 <= v <= MAX_RANK, _optional(_is_str), _optional(_is_int), _optional(_is_int),
           _optional(_is_str), _is_number, *[_is_int] * 5, _is_int, _is_int, _optional(_is_int)]
_ITEMS: dict[str, list[Callable[[Any], bool]]] = {
    "sample": _SAMPLE,
    "progress": [_is_int, _optional(_is_int)],
    "error": [_is_str, _optional(_is_str)],
    "part": [lambda v: _is_int(v) and v >= 0, lambda v: _is_int(v) and 0 < v <= RECORD_LIMIT // (LINE_LIMIT // 4) + 1,
             _is_str],
}
_VALUES: dict[str, Callable[[Any], bool]] = {
    "t0": _is_number, "stage": _is_str, "metrics": lambda v: isinstance(v, dict), "exit": _is_int,
}
KINDS = frozenset(_FIELDS) | frozenset(_ITEMS) | frozenset(_VALUES)


def parse_record(text: str) -> tuple[str, Any]:
    """(kind, payload) of a record's text, checked against its kind's shape; raises `BadRecord` saying why."""
    try:
        record = json.loads(text)
    except ValueError as e:
        raise BadRecord(f"not JSON ({e})") from None
    if not (isinstance(record, list) and len(record) == 2 and isinstance(record[0], str)):
        raise BadRecord("not a [kind, payload] pair")
    kind, payload = record
    if kind not in KINDS:
        raise BadRecord(f"unknown kind {kind[:40]!r}")
    if kind in _FIELDS:
        fields = _FIELDS[kind]
        if not isinstance(payload, dict) or set(payload) != set(fields):
            got = sorted(payload)[:8] if isinstance(payload, dict) else type(payload).__name__
            raise BadRecord(f"a {kind} record must have the fields {sorted(fields)}, got {got}")
        wrong = [name for name, check in fields.items() if not check(payload[name])]
    elif kind in _ITEMS:
        items = _ITEMS[kind]
        if not isinstance(payload, list) or len(payload) != len(items):
            raise BadRecord(f"a {kind} record must be a list of {len(items)} values")
        wrong = [str(i) for i, (check, value) in enumerate(zip(items, payload)) if not check(value)]
    else:
        wrong = [] if _VALUES[kind](payload) else ["payload"]
    if wrong:
        raise BadRecord(f"a {kind} record has values of the wrong type or range: {', '.join(wrong)}")
    return kind, payload


class LineWriter:
    """Writes records to the child's record pipe `fd` (its own; processes the job starts do not inherit it).

    One record's lines are written under a lock, so the sampler thread and the job's thread never interleave."""

    def __init__(self, fd: int):
        os.set_inheritable(fd, False)
        self._fd: int | None = fd
        self._lock = threading.Lock()

    def send(self, kind: str, payload: Any) -> None:
        lines = record_lines(kind, payload)
        with self._lock:
            if self._fd is None:
                raise RuntimeError("the job's record pipe is closed")
            for line in lines:
                view = memoryview(line)
                while view:
                    view = view[os.write(self._fd, view):]

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class WireSink:
    """A `jobs.samples.SampleSink` that sends each sample as a `sample` record (after one `t0` record)."""

    def __init__(self, writer: LineWriter, *, t0: float):
        self._writer = writer
        writer.send("t0", t0)

    def add(self, sample: MemorySample, *, rank: int = 0, **tags) -> None:
        self._writer.send("sample", sample_message(sample, rank=rank, **tags))

    def flush(self) -> None:
        """Nothing to do: every sample left the process when it was added."""

    def close(self) -> None:
        """Nothing to do: the reporter owns the pipe."""


class WireReporter:
    """A `jobs.reporting.Reporter` over this protocol; the spec comes from `DRAINBOARD_JOB_SPEC`."""

    remote = True

    def __init__(self, job_id: int, writer: LineWriter, environ: dict[str, str] | None = None):
        self.job_id = job_id
        self._environ = os.environ if environ is None else environ
        self._writer = writer
        self._writer.send("start", {"pid": os.getpid(), "host": socket.gethostname()})

    def spec(self) -> dict[str, Any] | None:
        raw = self._environ.get(ENV_SPEC)
        return None if raw is None else json.loads(raw)

    def sample_sink(self, t0: float, clock: Callable[[], float]) -> WireSink:
        return WireSink(self._writer, t0=t0)

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
        """The job's error, its text cut to fit the log (an error is never refused for its size)."""
        self._writer.send("error", [cut_text(summary, ERROR_TEXT_LIMIT // 8),
                                    None if detail is None else cut_text(detail, ERROR_TEXT_LIMIT)])

    def guard(self, trip: GuardTrip, t: float) -> None:
        """The memory guard on the child's node stopped the job at `t` s."""
        self._writer.send("guard", {"t": t, "message": trip.message, "data": trip.to_dict()})

    def close(self) -> None:
        self._writer.close()
