"""A generate job's input images: copied into the job's own artifact folder as it is queued, read from there.

The copy is made inside the transaction that inserts the job, so no worker can
claim the job before its images are in place, and a failed copy queues
nothing. Each copy is named after its field (`image.png`, `last_image.jpg`,
`ref_image.webp`) and recorded as an artifact, so the Job page and History
list it beside the video; the child never opens the path the user gave.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

from models.inputs import IMAGE_FORMATS, check_image
from storage.artifacts import artifact_row, job_dir, new_artifact_path, resolve_artifact

INPUT_FIELDS = ("image", "last_image", "ref_image")
"""GenerateParams fields that name an image file."""


def copy_inputs(conn: sqlite3.Connection, data_dir: str | Path, job_id: int, images: dict[str, str]) -> None:
    """Copy each image into job `job_id`'s folder and record it in `artifacts` through `conn` (the open
    transaction); on failure the folder is removed and the error raised, so the caller rolls back."""
    try:
        for field, path in images.items():
            kind, _ = check_image(path)  # again: the file may have changed since the spec was checked
            target = new_artifact_path(data_dir, job_id, field, IMAGE_FORMATS[kind])
            shutil.copyfile(path, target)
            row = artifact_row(data_dir, job_id, target)
            conn.execute("INSERT OR REPLACE INTO artifacts (job_id, name, size, media_type, created_at)"
                         " VALUES (:job_id, :name, :size, :media_type, :created_at)", row)
    except BaseException:
        shutil.rmtree(job_dir(data_dir, job_id), ignore_errors=True)
        raise


def input_copies(data_dir: str | Path, job_id: int, fields: list[str]) -> dict[str, str]:
    """Field -> the job's own copy of that image (ArtifactError when one is missing)."""
    copies = {}
    for field in fields:
        names = [f"{field}{suffix}" for suffix in IMAGE_FORMATS.values()]
        found = [n for n in names if (job_dir(data_dir, job_id) / n).is_file()]
        copies[field] = str(resolve_artifact(data_dir, job_id, found[0] if found else names[0]))
    return copies


def reuse_inputs(raw: dict[str, Any], original: dict[str, Any], data_dir: str | Path, job_id: int) -> dict[str, Any]:
    """`raw` (a retry's spec) with each image still as job `job_id` had it pointing at that job's own copy,
    so a retry never depends on the user's file still being there; images changed in `raw` are kept."""
    generate, before = raw.get("generate") or {}, original.get("generate") or {}
    same = [f for f in INPUT_FIELDS if generate.get(f) is not None and generate.get(f) == before.get(f)]
    if not same:
        return raw
    return {**raw, "generate": {**generate, **input_copies(data_dir, job_id, same)}}
