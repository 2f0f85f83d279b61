"""Small previews of a generate job's input images, read from the job's own folder (never the user's path).

History shows them in image cells, which take a URL: each thumbnail is a data URI
of a PNG at most THUMB_EDGE px on its longer side, cached by file and mtime.
"""

from __future__ import annotations

import base64
import io

import streamlit as st

from dashboard import data
from storage.artifacts import ArtifactError

THUMB_EDGE = 96
"""Longer side of a thumbnail, in pixels (History's rows are about 35 px high; a hover shows it larger)."""


@st.cache_data(max_entries=512, show_spinner=False)
def thumbnail(path: str, mtime: float, edge: int = THUMB_EDGE) -> str | None:
    """A data: URI of `path` shrunk to `edge` px, or None when it is no longer a readable image. `mtime` keys
    the cache, so a file replaced in place is read again."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.thumbnail((edge, edge))
            out = io.BytesIO()
            image.convert("RGB").save(out, "PNG")
    except (OSError, UnidentifiedImageError, Image.DecompressionBombError):
        return None
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def job_inputs(db: str, job_id: int, fields: tuple[str, ...]) -> dict[str, str]:
    """GenerateParams field -> thumbnail of the job's copy of that image (`image.png`...), for those it holds."""
    found = {}
    for artifact in data.artifacts(db, job_id):
        field = artifact["name"].rpartition(".")[0]
        if field in fields and artifact["media_type"].startswith("image/"):
            try:
                path = data.artifact_path(job_id, artifact["name"])
            except ArtifactError:
                continue
            if path.is_file():
                uri = thumbnail(str(path), path.stat().st_mtime)
                if uri is not None:
                    found[field] = uri
    return found
