"""A generate job's input files (images, a reference clip): copied into the job's own artifact folder as it is
queued, read from there.

The copy is made inside the transaction that inserts the job, so no worker can
claim the job before its inputs are in place, and a failed copy queues
nothing. Each copy is named after its field (`image.png`, `last_image.jpg`,
`ref_image.webp`, `ref_video.mp4`) and recorded as an artifact, so the Job page and History
list it beside the video; the child never opens the path the user gave.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

from models.inputs.clips import CLIP_SUFFIX, check_clip
from models.inputs.images import IMAGE_FORMATS, check_image
from models.request.params import INPUT_FILE_FIELDS as INPUT_FIELDS
from storage.artifacts import job_dir, new_artifact_path, record_artifact, resolve_artifact

CLIP_FIELDS = ("ref_video",)
"""Input fields that name a clip; the others name an image."""


def _checked_suffix(field: str, path: str) -> str:
    """The suffix the copy of `path` gets, checking the file again: it may have changed since the spec was."""
    if field in CLIP_FIELDS:
        check_clip(path)
        return CLIP_SUFFIX
    kind, _ = check_image(path)
    return IMAGE_FORMATS[kind]


def copy_inputs(conn: sqlite3.Connection, data_dir: str | Path, job_id: int, files: dict[str, str]) -> None:
    """Copy each input file into job `job_id`'s folder and record it in `artifacts` through `conn` (the open
    transaction); on failure the folder is removed and the error raised, so the caller rolls back."""
    try:
        for field, path in files.items():
            target = new_artifact_path(data_dir, job_id, field, _checked_suffix(field, path))
            shutil.copyfile(path, target)
            record_artifact(conn, data_dir, job_id, target)
    except BaseException:
        shutil.rmtree(job_dir(data_dir, job_id), ignore_errors=True)
        raise


def input_copies(data_dir: str | Path, job_id: int, fields: list[str]) -> dict[str, str]:
    """Field -> the job's own copy of that input (ArtifactError when one is missing)."""
    copies = {}
    for field in fields:
        suffixes = (CLIP_SUFFIX,) if field in CLIP_FIELDS else IMAGE_FORMATS.values()
        names = [f"{field}{suffix}" for suffix in suffixes]
        found = [n for n in names if (job_dir(data_dir, job_id) / n).is_file()]
        copies[field] = str(resolve_artifact(data_dir, job_id, found[0] if found else names[0]))
    return copies


def reuse_inputs(raw: dict[str, Any], original: dict[str, Any], data_dir: str | Path, job_id: int) -> dict[str, Any]:
    """`raw` (a retry's spec) with each input file still as job `job_id` had it pointing at that job's own copy,
    so a retry never depends on the user's file still being there; inputs changed in `raw` are kept."""
    generate, before = raw.get("generate") or {}, original.get("generate") or {}
    same = [f for f in INPUT_FIELDS if generate.get(f) is not None and generate.get(f) == before.get(f)]
    if not same:
        return raw
    return {**raw, "generate": {**generate, **input_copies(data_dir, job_id, same)}}
