"""Artifact folder per job: `<data_dir>/artifacts/<job_id>/`, and the one writer of the `artifacts` table.

File names are generated here from a fixed role and media type, never taken
from user input, and a download request is resolved only inside the job's own
folder. A file is registered in the table only through `record_artifact`
(`tests/storage/test_table_owners.py` fails when code elsewhere writes it).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import sqlite_utils

from core.errors import DrainboardError
from storage.connections import Executor

MEDIA_TYPES = {
    ".mp4": "video/mp4",
    ".wav": "audio/wav",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".webp": "image/webp",
    ".json": "application/json",
    ".csv": "text/csv",
    ".log": "text/plain",
}
"""Suffixes an artifact may have, with the media type served for each."""

_ROLE = re.compile(r"[a-z][a-z0-9_]{0,31}")


class ArtifactError(DrainboardError):
    """An artifact name or download path is not acceptable."""


def job_dir(data_dir: str | Path, job_id: int) -> Path:
    """The artifact folder of one job (not created)."""
    if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id < 1:
        raise ArtifactError(f"job id must be a positive integer, got {job_id!r}")
    return Path(data_dir).resolve() / "artifacts" / str(job_id)


def new_artifact_path(data_dir: str | Path, job_id: int, role: str, suffix: str) -> Path:
    """A fresh path for a job's output, e.g. role "video", suffix ".mp4" -> `.../7/video.mp4`.

    A second file of the same role gets `video-2.mp4`, and so on. The folder is
    created. `role` is a short lowercase word chosen by code, not by a user.
    """
    if not _ROLE.fullmatch(role):
        raise ArtifactError(f"artifact role must match {_ROLE.pattern}, got {role!r}")
    if suffix not in MEDIA_TYPES:
        raise ArtifactError(f"artifact suffix {suffix!r} is not one of {', '.join(MEDIA_TYPES)}")
    folder = job_dir(data_dir, job_id)
    folder.mkdir(parents=True, exist_ok=True)
    path, n = folder / f"{role}{suffix}", 1
    while path.exists():
        n += 1
        path = folder / f"{role}-{n}{suffix}"
    return path


def record_artifact(db: Executor, data_dir: str | Path, job_id: int, path: str | Path) -> dict:
    """Register a finished file in the job's folder (through `db`, or the connection of the caller's open
    transaction); returns its row (name, size, media type). A file of the same name is registered anew."""
    path = resolve_artifact(data_dir, job_id, Path(path).name)
    row = {"job_id": job_id, "name": path.name, "size": path.stat().st_size, "media_type": MEDIA_TYPES[path.suffix],
           "created_at": time.time()}
    db.execute("INSERT OR REPLACE INTO artifacts (job_id, name, size, media_type, created_at)"
               " VALUES (:job_id, :name, :size, :media_type, :created_at)", row)
    return row


def resolve_artifact(data_dir: str | Path, job_id: int, name: str) -> Path:
    """The existing file `name` in the job's folder; anything else (`..`, absolute paths,
    links leading out, subfolders, unknown suffixes, missing files) is refused."""
    folder = job_dir(data_dir, job_id)
    candidate = (folder / name).resolve()
    if candidate.parent != folder or Path(name).name != name:
        raise ArtifactError(f"artifact {name!r} is outside job {job_id}'s folder")
    if candidate.suffix not in MEDIA_TYPES:
        raise ArtifactError(f"artifact {name!r} has an unknown suffix")
    if not candidate.is_file():
        raise ArtifactError(f"job {job_id} has no artifact {name!r}")
    return candidate


def remove_unrecorded(
    db: sqlite_utils.Database, data_dir: str | Path, job_id: int, *, keep: tuple[str, ...] = ()
) -> list[Path]:
    """Delete the files in a job's folder that were never registered (nor named in `keep`): what a job
    that died mid-write (a half-encoded `video.mp4`) left. Returns the paths removed."""
    folder = job_dir(data_dir, job_id)
    recorded = {r[0] for r in db.execute("SELECT name FROM artifacts WHERE job_id = ?", [job_id])} | set(keep)
    removed = []
    try:
        entries = list(folder.iterdir())
    except FileNotFoundError:
        return removed
    for path in entries:
        if path.name not in recorded and (path.is_symlink() or path.is_file()):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
