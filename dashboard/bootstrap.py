"""First start: the data folder and database, the demo checkpoint, a supervisor.

Kept free of Streamlit: `prepare` reports through a callback, and the frame
draws that as a status box with a progress bar. A lock file keeps two
sessions (or two dashboards) from writing the demo checkpoint at once.
"""

from __future__ import annotations

import fcntl
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from core.errors import DrainboardError
from dashboard import format as fmt
from storage.config import Config
from storage.schema import open_database

DEMO_NAME = "demo"
"""Folder name of the embedded demo checkpoint under the first model root."""

Progress = Callable[[float, str], None]
"""on_progress(fraction done in [0, 1], what is happening)."""


@dataclass(frozen=True)
class Prepared:
    """What `prepare` found or did."""

    demo_path: Path
    """Where the demo checkpoint is."""
    wrote_demo: bool
    """True when this call wrote it."""
    supervisor: dict
    """jobs.supervisor.supervisor_status after the call."""
    demo_error: str | None = None
    """Why the demo checkpoint could not be written (e.g. the disk is too small); None when it was or is there."""


def demo_path(config: Config) -> Path:
    return config.model_roots[0] / DEMO_NAME


def demo_missing(config: Config) -> bool:
    """True when the demo checkpoint has not been written (completely) yet."""
    return not (demo_path(config) / "modular_model_index.json").is_file()


def prepare(config: Config, on_progress: Progress = lambda fraction, text: None, *, start_worker: bool = True) -> Prepared:
    """Make the box ready: data folder + schema, demo checkpoint, supervisor (unless `start_worker` is False)."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    open_database(config.db_path).conn.close()
    wrote, demo_error = False, None
    if demo_missing(config):
        with open(config.data_dir / "demo.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if demo_missing(config):
                try:
                    write_demo(demo_path(config), on_progress)
                    wrote = True
                except DrainboardError as e:  # the supervisor still starts: other checkpoints can be loaded
                    demo_error = str(e)
    status: dict = {"alive": False}
    if start_worker:
        from jobs.presence import ensure_supervisor

        on_progress(1.0, "starting the job supervisor")
        status = ensure_supervisor(config)
    return Prepared(demo_path(config), wrote, status, demo_error)


def write_demo(path: Path, on_progress: Progress) -> None:
    """Write the `demo` profile's random-weight MiniMax H3 checkpoint to `path` (models' writer)."""
    from models.synth.writer import synth_h3
    from models.synth.profiles import get_profile

    path.parent.mkdir(parents=True, exist_ok=True)
    synth_h3(
        path,
        get_profile(DEMO_NAME),
        on_bytes=lambda done, total: on_progress(done / total if total else 1.0, f"writing the demo checkpoint: {fmt.gib(done)} of {fmt.gib(total)}"),
    )
