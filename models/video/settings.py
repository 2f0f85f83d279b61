"""The settings a Drainboard video carries with it: its generate parameters, written into the MP4's metadata and
read back, so a video dropped on the Run page fills the form as the job that made it was filled (as ComfyUI does
with its outputs).

They travel as JSON in the MP4's `comment` tag (the one free-text tag FFmpeg's MP4 muxer keeps without extra
flags), marked with SETTINGS_KEY. Input files travel by name only (a path names someone's disk), the checkpoint by
its folder and, for a hub snapshot, its revision; `extra` is the hook for what a job adds beside its parameters
(a plan, levers chosen for it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any, Mapping

from core.errors import DrainboardError
from core.jsonfile import JSONProblem, parse_json

from ..request.params import INPUT_FILE_FIELDS, GenerateParams

SETTINGS_KEY = "drainboard_settings"
"""Marks a comment as Drainboard's; its value is the format's version."""
SETTINGS_VERSION = 1
MAX_SETTINGS_CHARS = 256 * 1024
"""The longest settings comment read back (a prompt is at most a few KiB): a crafted file gets a bounded parse."""


class VideoSettingsError(DrainboardError):
    """A video whose settings cannot be read."""


def video_settings(params: GenerateParams, model_dir: str | os.PathLike,
                   extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a generate's MP4 records: every GenerateParams field (input files by name), the workflow it ran, the
    checkpoint's folder name and hub revision (None for a plain folder), and `extra`."""
    generate = params.to_dict()
    for field in INPUT_FILE_FIELDS:
        if generate.get(field):
            generate[field] = Path(generate[field]).name
    generate["workflow"] = params.resolved_workflow
    root = Path(model_dir)
    revision = root.name if root.parent.name == "snapshots" else None
    model = root.parent.parent.name if revision else root.name
    return {SETTINGS_KEY: SETTINGS_VERSION, "generate": generate, "model": {"name": model, "revision": revision},
            **dict(extra or {})}


def read_video_settings(source: str | os.PathLike | IO[bytes]) -> dict[str, Any] | None:
    """The settings a Drainboard MP4 carries (`source`: a path or an open binary file); None for a video without
    them; VideoSettingsError, in one line, for a file that is not a readable video or whose settings are damaged."""
    import av

    try:
        with av.open(source, mode="r") as container:
            comment = container.metadata.get("comment")
    except (av.error.FFmpegError, OSError, ValueError) as e:
        raise VideoSettingsError(f"not a readable video: {e}") from None
    if not comment or SETTINGS_KEY not in comment[:64]:
        return None
    if len(comment) > MAX_SETTINGS_CHARS:
        raise VideoSettingsError(f"its settings are {len(comment):,} characters; at most {MAX_SETTINGS_CHARS:,} are read")
    try:
        settings = parse_json(comment)
    except JSONProblem as e:
        raise VideoSettingsError(f"its settings are damaged: {e}") from None
    if not isinstance(settings, dict) or not isinstance(settings.get("generate"), dict):
        raise VideoSettingsError("its settings have no generate parameters")
    return settings
