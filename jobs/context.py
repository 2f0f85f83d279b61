"""What a job kind sees of the world: progress, memory samples, events, stages, artifact paths.

Kinds report only through this object and never touch storage directly, so a
kind is one plain function that tests can run with any context.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from jobs.reporting import DatabaseReporter, Reporter
from jobs.samples import PipeSink
from machine.memory import MemoryProbe, MemorySample
from storage.artifacts import new_artifact_path
from storage.config import Config, resolved_config

PROGRESS_INTERVAL = 0.2
"""Seconds between progress writes; the last step is always written."""


class JobContext:
    """The running job's reporting channel, owned by the job child.

    `probe` is the memory probe of this job (with the cgroup file when the job
    runs under a limit); pass it to the loader so one probe read per tensor
    serves both the load metrics and the recorded sample. Everything else goes
    to `reporter` (`jobs.reporting`: the database at `db_path` by default, or the
    line protocol). Samples go to the supervisor's pipe `sample_fd` in a
    job child, else where the reporter sends them. `config` is the configuration the
    job runs under (`jobs.child` hands in the one its worker resolved).
    """

    def __init__(
        self,
        job_id: int,
        *,
        data_dir: str | Path,
        probe: MemoryProbe,
        db_path: str | Path | None = None,
        reporter: Reporter | None = None,
        sample_every: int = 1,
        clock: Callable[[], float] = time.monotonic,
        sample_fd: int | None = None,
        config: Config | None = None,
    ):
        if (db_path is None) == (reporter is None):
            raise ValueError("a job context needs exactly one of db_path and reporter")
        self.job_id = job_id
        self.probe = probe
        self.data_dir = Path(data_dir)
        self.sample_every = sample_every
        """Record one sample every N placed tensors (the spec's `sample_every`)."""
        self._clock = clock
        self._t0 = clock()
        self._config = config
        self._owns_reporter = reporter is None
        self.reporter = reporter or DatabaseReporter(job_id, db_path, data_dir)
        self._stage: str | None = None
        self._last_progress = float("-inf")
        self.samples = (PipeSink(sample_fd, t0=self._t0) if sample_fd is not None
                        else self.reporter.sample_sink(self._t0, clock))

    @property
    def config(self) -> Config:
        """The configuration the job runs under (model roots, memory floor): the one its worker resolved
        (`jobs.child` hands it in); a context made without one resolves it here."""
        if self._config is None:
            self._config = resolved_config()
        return self._config

    def seconds(self) -> float:
        """Seconds since the job started (the time axis of samples and events)."""
        return self._clock() - self._t0

    def event(self, kind: str, message: str, *, data: dict[str, Any] | None = None) -> None:
        """Record an event (stage_start, stage_end, decision, device, warning, ...) at the current time."""
        self.reporter.event({"t": self.seconds(), "created_at": time.time(), "kind": kind, "stage": self._stage,
                             "message": message, "data": json.dumps(data) if data is not None else None})

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Mark a stage: events at start and end (with its duration), and the job's current stage.

        Samples are flushed at both ends, so a kill inside a stage still finds
        everything recorded before it in the database.
        """
        self.samples.flush()
        self._stage = name
        self.reporter.stage(name)
        self.event("stage_start", f"{name} started")
        start = self.seconds()
        ok = False
        try:
            yield
            ok = True
        finally:
            self.samples.flush()
            took = self.seconds() - start
            self.event("stage_end", f"{name} {'done' if ok else 'aborted'} after {took:.2f} s",
                       data={"seconds": took, "ok": ok})

    def progress(self, done: int, total: int | None = None) -> None:
        """Report `done` of `total` steps (tensors, denoising steps); written at most 5 times a second."""
        now = self._clock()
        if now - self._last_progress < PROGRESS_INTERVAL and done != total:
            return
        self._last_progress = now
        self.reporter.progress(done, total)

    def record(
        self,
        sample: MemorySample | None = None,
        *,
        stage: str | None = None,
        tensors_placed: int | None = None,
        bytes_placed: int | None = None,
        tensor_name: str | None = None,
        rank: int = 0,
    ) -> None:
        """Record a memory sample (a fresh probe read when none is given), tagged with the current stage.

        `rank` files a sample taken by another process of a sharded load under its own curve.
        """
        self.samples.add(
            sample if sample is not None else self.probe.sample(),
            rank=rank,
            stage=stage or self._stage,
            tensors_placed=tensors_placed,
            bytes_placed=bytes_placed,
            tensor_name=tensor_name,
        )

    def artifact_path(self, role: str, suffix: str) -> Path:
        """A fresh generated path in this job's artifact folder (see storage.artifacts)."""
        return new_artifact_path(self.data_dir, self.job_id, role, suffix)

    def add_artifact(self, path: str | Path) -> None:
        """Register a finished file written at a path from `artifact_path`."""
        self.reporter.artifact(Path(path))

    def close(self) -> None:
        """Flush samples and release the reporter made from `db_path` (a given one stays its owner's);
        called by the child however the kind ended."""
        self.samples.close()
        if self._owns_reporter:
            self.reporter.close()
