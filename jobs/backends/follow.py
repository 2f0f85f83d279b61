"""The receiving end of `jobs.wire`: applies one job's tagged lines to the database, the rest to its child log.

A backend feeds it the job's output as it arrives, in chunks of any size. The
writes are `jobs.reporting.DatabaseReporter`'s (the ones a local child makes) and
samples go through `jobs.samples.SampleStore` (the local relay's), so the tables
look the same whichever machine ran the job.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from jobs.reporting import DatabaseReporter
from jobs.samples import SampleStore
from storage.artifacts import MEDIA_TYPES, job_dir


class Follower:
    """Applies one job's stream. `last` is the newest sample stored, `exit_code` the child's `exit` line,
    `started` its `start` line; `error` is set when the database refused samples (they are dropped after)."""

    def __init__(self, db_path: str | Path, data_dir: str | Path, job_id: int, log_path: Path):
        self._db_path, self._data_dir, self.job_id = db_path, Path(data_dir), job_id
        self._reporter = DatabaseReporter(job_id, db_path, data_dir)
        self._log = open(log_path, "ab")
        self._pending = ""
        self._samples: SampleStore | None = None
        self._receiving: dict[str, tuple[Any, Any, int]] = {}
        self.started: dict | None = None
        self.exit_code: int | None = None
        self.guard: dict | None = None
        """The `guard` line of a job the memory guard on its node stopped; `guard_sample` the last sample then."""
        self.guard_sample: dict | None = None
        self.error: BaseException | None = None
        self.received = 0
        """Tagged lines applied."""

    @property
    def last(self) -> dict | None:
        return self._samples.last if self._samples is not None else None

    def feed(self, text: str) -> None:
        """Apply every complete line of `text` (a partial last line waits for the next chunk)."""
        from jobs.wire import decode

        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        for line in lines:
            message = decode(line)
            if message is None:
                self._log.write((line + "\n").encode(errors="replace"))
            else:
                try:
                    self._apply(*message)
                except (ValueError, KeyError, TypeError) as e:  # a malformed line must not stop the stream
                    self._log.write(f"drainboard: a {message[0]} line could not be applied: {e}\n".encode())
                self.received += 1
        self._log.flush()

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
            self._samples = SampleStore(self._db_path, self.job_id, payload)
        elif kind == "start":
            self.started = payload
            self._reporter.event({"t": 0.0, "created_at": time.time(), "kind": "host", "stage": None,
                                  "message": f"running on {payload['host']} (pid {payload['pid']})",
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
            self.exit_code = int(payload)
        elif kind in ("artifact", "chunk", "artifact_end"):
            self._receive(kind, payload)

    def _receive(self, kind: str, payload: dict) -> None:
        """An artifact arrives as begin, chunks, end; it is registered only once whole and checked."""
        name = payload["name"]
        if kind == "artifact":
            if Path(name).name != name or Path(name).suffix not in MEDIA_TYPES or name.startswith("child"):
                raise ValueError(f"job {self.job_id} sent an artifact named {name!r}: not a plain artifact name")
            folder = job_dir(self._data_dir, self.job_id)
            folder.mkdir(parents=True, exist_ok=True)
            self._receiving[name] = (open(folder / f"{name}.part", "wb"), hashlib.sha256(), payload["size"])
        elif kind == "chunk":
            data = base64.b64decode(payload["data"])
            file, digest, _ = self._receiving[name]
            file.write(data)
            digest.update(data)
        else:
            file, digest, size = self._receiving.pop(name)
            file.close()
            part = Path(file.name)
            if digest.hexdigest() != payload["sha256"] or part.stat().st_size != size:
                part.unlink()
                raise ValueError(f"job {self.job_id}: artifact {name} arrived damaged")
            part.rename(part.with_name(name))
            self._reporter.artifact(part.with_name(name))

    def close(self) -> None:
        """Apply a last line left without a newline, store buffered samples, drop half-received files."""
        if self._pending:
            self.feed("\n")
        if self._samples is not None:
            self.error = self.error or self._samples.close()
        for file, _, _ in self._receiving.values():
            file.close()
            Path(file.name).unlink(missing_ok=True)
        self._receiving.clear()
        self._log.close()
        self._reporter.close()
