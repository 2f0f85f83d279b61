"""The receiving end of `jobs.wire`: applies one job's records to the database, the rest to its child log.

A backend feeds it the job's log as it arrives, in chunks of any size. Only a line that begins with
the job's own tag (its id and its secret nonce) is a record; every other line, one that imitates the
protocol included, is the job's output and goes to its child log. The writes are
`jobs.reporting.DatabaseReporter`'s (the ones a local child makes) and samples go through
`jobs.samples.SampleStore` (the local relay's), so the tables look the same whichever machine ran the
job. A record that cannot be applied (bad JSON, an unknown kind, wrong types, a row the database
refuses) is said in the child log, and in the job's events at most `BAD_RECORDS_SAID` times; the
stream goes on.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from core.echo import echo
from jobs.reporting import DatabaseReporter
from jobs.samples import SampleStore
from jobs.wire import LINE_LIMIT, RECORD_LIMIT, BadRecord, parse_record, tag
from storage.artifacts import MEDIA_TYPES, job_dir

BAD_RECORDS_SAID = 5
"""Bad records said one by one in the job's events; the rest are counted, and the count said at the end."""


class Follower:
    """Applies one job's stream. `last` is the newest sample stored, `exit_code` the relay's `exit` record,
    `started` the `start` record; `error` is set when the database refused samples (they are dropped after)."""

    def __init__(self, db_path: str | Path, data_dir: str | Path, job_id: int, log_path: Path, nonce: str):
        self._db_path, self._data_dir, self.job_id = db_path, Path(data_dir), job_id
        self._prefix = tag(job_id, nonce)
        self._reporter = DatabaseReporter(job_id, db_path, data_dir)
        self._log = open(log_path, "ab")
        self._pending = ""
        self._parts: list[str] = []
        self._count = 0
        self._samples: SampleStore | None = None
        self._receiving: dict[str, tuple[Any, Any, int]] = {}
        self.started: dict | None = None
        self.exit_code: int | None = None
        self.guard: dict | None = None
        """The `guard` record of a job the memory guard on its node stopped; `guard_sample` the last sample then."""
        self.guard_sample: dict | None = None
        self.error: BaseException | None = None
        self.received = 0
        """Records applied."""
        self.bad = 0
        """Records that could not be applied."""

    @property
    def last(self) -> dict | None:
        return self._samples.last if self._samples is not None else None

    def feed(self, text: str) -> None:
        """Apply every complete line of `text` (a partial last line waits for the next chunk)."""
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        for line in lines:
            if line.startswith(self._prefix):
                self._record(line[len(self._prefix):])
            else:
                self._log.write((line + "\n").encode(errors="replace"))
        self._log.flush()

    def _record(self, text: str) -> None:
        try:
            kind, payload = parse_record(text)
            if kind == "part":
                whole = self._join(*payload)
                if whole is None:
                    return
                kind, payload = parse_record(whole)
                if kind == "part":
                    raise BadRecord("a part inside a part")
            self._apply(kind, payload)
            self.received += 1
        except Exception as e:  # noqa: BLE001 - no line may stop the stream: the job's end must be recorded
            self._bad(e)

    def _join(self, index: int, count: int, piece: str) -> str | None:
        """The record's text once its last part arrived, else None."""
        if index != len(self._parts) or (self._parts and count != self._count):
            self._parts = []
            raise BadRecord(f"part {index} of {count} out of order")
        self._count = count
        self._parts.append(piece)
        if sum(map(len, self._parts)) > RECORD_LIMIT:
            self._parts = []
            raise BadRecord(f"parts longer than the {RECORD_LIMIT:,} bytes a record may have")
        if index + 1 < count:
            return None
        whole, self._parts = "".join(self._parts), []
        return whole

    def _bad(self, e: BaseException) -> None:
        """Say a record that could not be applied: in the child log always, in the job's events a few times."""
        self.bad += 1
        message = f"a record from the job's node could not be applied: {type(e).__name__}: {echo(str(e), 300)}"
        self._log.write(f"drainboard: {message}\n".encode(errors="replace"))
        if self.bad > BAD_RECORDS_SAID:
            return
        if self.bad == BAD_RECORDS_SAID:
            message += f" (the {BAD_RECORDS_SAID}th; more are only counted)"
        self._warn(message)

    def _warn(self, message: str) -> None:
        try:
            self._reporter.event({"t": (self.last or {}).get("t", 0.0), "created_at": time.time(), "kind": "warning",
                                  "stage": None, "message": message, "data": None})
        except Exception as e:  # noqa: BLE001 - the database refused even this: the child log keeps it
            self._log.write(f"drainboard: could not record a warning: {e}\n".encode(errors="replace"))

    def _apply(self, kind: str, payload: Any) -> None:
        if kind == "sample":
            if self._samples is None or self.error is not None:
                return
            try:
                self._samples.add(payload)
            except Exception as e:  # noqa: BLE001 - keep following: the job's end must still be recorded
                self.error = e
                self._samples.discard()
        elif kind == "t0":
            if self._samples is not None:
                raise BadRecord("a second t0 record")
            self._samples = SampleStore(self._db_path, self.job_id, payload)
        elif kind == "start":
            self.started = payload
            self._reporter.event({"t": 0.0, "created_at": time.time(), "kind": "host", "stage": None,
                                  "message": f"running on {echo(payload['host'])} (pid {payload['pid']})",
                                  "data": json.dumps(payload)})
        elif kind == "event":
            self._reporter.event(payload)
        elif kind == "stage":
            self._reporter.stage(payload)
        elif kind == "progress":
            self._reporter.progress(*payload)
        elif kind == "metrics":
            self._reporter.metrics(payload)
        elif kind == "error":
            self._reporter.error(*payload)
        elif kind == "guard":
            self.guard, self.guard_sample = payload, self.last
            self._reporter.event({"t": payload["t"], "created_at": time.time(), "kind": "memory_guard",
                                  "stage": (self.last or {}).get("stage"), "message": f"memory guard: {payload['message']}",
                                  "data": json.dumps(payload["data"])})
        elif kind == "exit":
            self.exit_code = payload
        elif kind == "dropped":
            raise BadRecord(f"the node dropped a record line over {payload['limit']:,} bytes (the most is {LINE_LIMIT:,})")
        else:
            self._receive(kind, payload)

    def _receive(self, kind: str, payload: dict) -> None:
        """An artifact arrives as begin, chunks, end; it is registered only once whole and checked."""
        name = payload["name"]
        if kind == "artifact":
            if Path(name).name != name or Path(name).suffix not in MEDIA_TYPES or name.startswith("child"):
                raise BadRecord(f"job {self.job_id} sent an artifact named {echo(name)}: not a plain artifact name")
            folder = job_dir(self._data_dir, self.job_id)
            folder.mkdir(parents=True, exist_ok=True)
            if name in self._receiving:
                self._drop(name)
            self._receiving[name] = (open(folder / f"{name}.part", "wb"), hashlib.sha256(), payload["size"])
            return
        if name not in self._receiving:
            raise BadRecord(f"a {kind} record for {echo(name)}, which is not being received")
        file, digest, size = self._receiving[name]
        if kind == "chunk":
            data = base64.b64decode(payload["data"], validate=True)
            if file.tell() + len(data) > size:
                self._drop(name)
                raise BadRecord(f"job {self.job_id}: artifact {echo(name)} is longer than the {size:,} bytes announced")
            file.write(data)
            digest.update(data)
            return
        self._receiving.pop(name)
        file.close()
        part = Path(file.name)
        if digest.hexdigest() != payload["sha256"] or part.stat().st_size != size:
            part.unlink()
            raise BadRecord(f"job {self.job_id}: artifact {echo(name)} arrived damaged")
        part.rename(part.with_name(name))
        self._reporter.artifact(part.with_name(name))

    def _drop(self, name: str) -> None:
        file, _, _ = self._receiving.pop(name)
        file.close()
        Path(file.name).unlink(missing_ok=True)

    def close(self) -> None:
        """Apply a last line left without a newline, store buffered samples, drop half-received files."""
        if self._pending:
            self.feed("\n")
        if self._samples is not None:
            self.error = self.error or self._samples.close()
        for name in list(self._receiving):
            self._drop(name)
        if self.bad > BAD_RECORDS_SAID:
            self._warn(f"{self.bad} records from the job's node could not be applied in all (see its child log)")
        self._log.close()
        self._reporter.close()
