"""A job's own process, learned from this machine's past jobs, as `models.forecast.eta` learns seconds.

A job child is forked from the worker's fork server with torch and the loader
imported; before its first weight it imports the rest (diffusers, transformers,
the tokenizer) and builds the pipeline. How much that adds depends on the
installed packages, the Python build and the allocator, not on the checkpoint,
so no constant holds from one machine to the next (464 MiB of VmRSS on one box
was 410 MiB on the next). Each past job of the same kind on the same device
left two figures (`jobs.history.process_records` reads them from its samples):

- `ready_bytes`: the process's VmRSS at its first weight (a generate's first
  `load.*` stage, a load's `load` stage): what the job's whole peak stands on;
- `startup_bytes`: how far system in use grew from the job's start (its first
  sample) to that moment, as far as the job can have grown it (`jobs.history.
  start_up`): the process's share of what the memory guard's budget counts
  (docs/metrics.md, "A job's memory").

The estimate is the median of each over the matching records. Where there is
none it says so (`NO_HISTORY`) rather than inventing a number. Plain records in,
no storage.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from .eta import NO_HISTORY
from .stages import GenerateForecast


@dataclass(frozen=True)
class ProcessRecord:
    """One past job's process before its first weight."""

    kind: str
    """`generate` or `load`."""
    device: str
    """Where it ran (`models.forecast.eta.device_key`)."""
    ready_bytes: int
    """VmRSS at its first weight."""
    startup_bytes: int
    """Growth of system in use (MemTotal - MemAvailable) from its first sample to its first weight."""


@dataclass(frozen=True)
class ProcessEstimate:
    """What a new job's process will hold before its first weight; None without history."""

    ready_bytes: int | None
    """VmRSS at its first weight."""
    startup_bytes: int | None
    """What the budget counts of it (growth of system in use over the job's start)."""
    basis: str
    """"median of 3 past jobs", or NO_HISTORY."""

    @property
    def known(self) -> bool:
        return self.startup_bytes is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate_process(records: Iterable[ProcessRecord], kind: str, device: str) -> ProcessEstimate:
    """The median process of `kind` jobs on `device` in `records` (any kind's and device's; only those count)."""
    found = [r for r in records if r.kind == kind and r.device == device]
    if not found:
        return ProcessEstimate(None, None, NO_HISTORY)
    return ProcessEstimate(int(statistics.median(r.ready_bytes for r in found)),
                           max(0, int(statistics.median(r.startup_bytes for r in found))),
                           f"median of {len(found)} past job{'s' * (len(found) != 1)}")


def job_peak(forecast: GenerateForecast, process: ProcessEstimate) -> int | None:
    """The whole job's predicted peak, as its VmRSS (plus device memory) would show it: the process at its
    first weight, what the forecast adds to the process (CUDA's libraries, a clip) and the largest stage.
    None without history."""
    if process.ready_bytes is None:
        return None
    return (process.ready_bytes + forecast.process_host_bytes + forecast.process_device_bytes
            + forecast.predicted_peak_bytes)
