"""Where the supervisor's jobs run when not on this machine.

The embedded supervisor (`jobs.supervisor`) runs each job as a child process
here. A `Backend` runs it elsewhere behind the same queue: the supervisor still
claims jobs, keeps heartbeats and records every end in SQLite; the backend
starts, watches, cancels and ends one job at a time. `backend_for(config)` is
None unless a Ray address is configured, and only then is `ray` imported.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Protocol

from storage.config import ConfigError

if TYPE_CHECKING:
    import sqlite_utils

    from storage.config import Config


class Backend(Protocol):
    """One job at a time on somewhere other than this machine."""

    name: str
    """How the backend is named in events and errors (`ray`)."""

    def ready(self, now: float) -> bool:
        """Whether a job may be claimed now (the cluster answers); says once why not."""

    def start(self, job: dict) -> None:
        """Submit the claimed job (a `storage.queries.get_job` row); a refusal ends the job `failed`."""

    def watch(self, now: float) -> bool:
        """Follow the running job: cancel it when asked, record its end. True while it still runs."""

    def running_job(self) -> int | None:
        """The id of the job in hand, if any."""

    def stop(self) -> None:
        """Stop the job in hand (it ends `interrupted`) and let go of the cluster."""


def backend_for(config: Config, db: sqlite_utils.Database, supervisor_id: str) -> Backend | None:
    """The backend `config` names, or None for this machine's own children."""
    if not config.ray_address:
        return None
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(f"ray_address is set ({config.ray_address}) but ray is not installed here: "
                          f"pip install -r requirements-ray.txt")
    from jobs.backends.ray_jobs import RayJobsBackend

    return RayJobsBackend(config, db, supervisor_id)
