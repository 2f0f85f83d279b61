"""The workflow's images on the Run page (an uploader with a preview per input) and on the Job page (a strip).

Self-contained: the Run page calls `workflow_section` inside its generate
form and merges the returned fields into the spec's `generate` mapping, then
`stage_plan_section` once the knobs that change the plan are chosen; an
upload is checked for size before anything is written, written once under
`<data_dir>/uploads/` (named by its digest), an image decoded there (a bad one
is removed and named in one line), and submit copies it into the job's own
folder, where the Job page's `input_strip` shows it. Uploads no queued job
names are removed once they are `UPLOAD_GRACE_SECONDS` old (a form still
holding one writes it again on its next rerun).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd
import streamlit as st

from core.echo import echo
from core.errors import DrainboardError
from dashboard import format as fmt
from dashboard import words
from dashboard.views.run import FIELD_LABELS
from models.inputs.clips import CLIP_FORMATS, MAX_CLIP_BYTES, MAX_CLIP_SECONDS
from models.inputs.images import MAX_IMAGE_BYTES, InputImageError, check_image
from models.request.params import INPUT_FILE_FIELDS
from models.quantization.quantize import DIT_COMPONENTS
from models.run.workflows import WORKFLOW_CLIPS, WORKFLOW_INPUTS, WORKFLOWS, stage_plan

INPUT_LABELS = {field: role.capitalize() for field, role in words.INPUT_WORDS.items()}
"""Uploader label per GenerateParams image field."""
CLIP_LABELS = {field: role.capitalize() for field, role in words.CLIP_WORDS.items()}
"""Uploader label per GenerateParams clip field."""
WORKFLOW_HELP = {"t2va": "text to video with audio", "fl2va": "from a first and/or last frame",
                 "ref2va": "from a reference image and/or clip (loads transformer_ref, the second DiT)"}
"""One line per workflow for the workflow control."""


UPLOAD_GRACE_SECONDS = 15 * 60
"""How old an upload no queued job names must be before it is removed: a form being filled keeps its files."""
IMAGE_TYPES = ["png", "jpg", "jpeg", "webp"]
"""The suffixes the image uploaders offer."""


class UploadError(DrainboardError):
    """An upload the Run page refuses (too large, or not an image): said in one line, nothing kept."""


def upload_limit(clip: bool) -> int:
    """The bytes an uploader accepts: the limit submit enforces on the same input (32 MiB images, 256 MiB clips)."""
    return MAX_CLIP_BYTES if clip else MAX_IMAGE_BYTES


def save_upload(data_dir: Path, name: str, size: int, body: Callable[[], bytes], clip: bool) -> Path:
    """Write an upload under `<data_dir>/uploads/` by its digest (the suffix kept) and return the path.
    UploadError, with nothing written, when `size` is over the input's limit; an image is decoded once written
    and removed again when it is not a usable image (submit checks a clip's streams)."""
    limit = upload_limit(clip)
    if size > limit:
        raise UploadError(f"{echo(name)} is {fmt.gib(size)}: {'clips' if clip else 'images'} up to "
                          f"{fmt.gib(limit)} are accepted. Nothing was kept.")
    content = body()
    folder = Path(data_dir) / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (hashlib.sha256(content).hexdigest()[:32] + Path(name).suffix.lower())
    if not path.exists():
        partial = path.with_name(path.name + ".partial")
        partial.write_bytes(content)
        partial.replace(path)
    else:
        path.touch()  # still in use: the grace period starts again
    if not clip:
        try:
            check_image(path)
        except InputImageError as e:
            path.unlink(missing_ok=True)
            why = str(e).removeprefix(f"{path}: ").replace(f" {str(path)!r}", "")  # Pillow names the file too
            raise UploadError(f"{echo(name)}: {why}. Nothing was kept.") from None
    return path


def prune_uploads(data_dir: Path, wanted: Iterable[str], *, now: float | None = None,
                  grace: float = UPLOAD_GRACE_SECONDS) -> list[Path]:
    """Remove the files under `<data_dir>/uploads/` that no path in `wanted` (the queued jobs' inputs) names and
    that are older than `grace` seconds; returns what was removed."""
    folder = Path(data_dir) / "uploads"
    if not folder.is_dir():
        return []
    keep = {Path(p).name for p in wanted if p and Path(p).parent == folder}
    cutoff = (time.time() if now is None else now) - grace
    removed = []
    for path in folder.iterdir():
        try:
            if path.name not in keep and path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink()
                removed.append(path)
        except OSError:
            continue  # another session removed or replaced it meanwhile
    return removed


def queued_inputs(jobs: Iterable[dict]) -> list[str]:
    """Every input file path the queued jobs' specs name (what `prune_uploads` must keep)."""
    return [str(generate[field]) for job in jobs if job["status"] == "queued"
            for generate in [(job.get("spec") or {}).get("generate") or {}]
            for field in INPUT_FILE_FIELDS if generate.get(field)]


def plan_table(workflow: str, audio: bool, sequential: bool = True, quantize: str | None = None) -> pd.DataFrame:
    """The workflow's weight-reading stages with what is loaded before, resident during and released after each,
    in words; a quantized DiT is named with its weights' type."""
    def named(components) -> str:
        return ", ".join(words.component(c) + (f" ({quantize} weights)" if quantize and c in DIT_COMPONENTS else "")
                         for c in components)

    return pd.DataFrame([{"stage": words.stage(s.block), "loads": named(s.loads), "resident": named(s.resident),
                          "releases": named(s.releases)}
                         for s in stage_plan(workflow, audio=audio, sequential=sequential) if s.reads],
                        columns=["stage", "loads", "resident", "releases"])


def stage_plan_section(workflow: str, audio: bool, sequential: bool, quantize: str | None) -> None:
    """The stage plan, folded: what each stage holds, as the job will run it."""
    how = "one component at a time" if sequential else "every component resident"
    with st.expander(f"Stage plan of {workflow} ({how})"):
        st.dataframe(plan_table(workflow, audio, sequential, quantize), hide_index=True, width="stretch",
                     key="run_stage_plan")
        st.caption("Set by “One component at a time” above: with it, each component is loaded just before the first"
                   " stage that reads it and released after the last; without it, all stay from the first stage on.")


def workflow_section(data_dir: Path, audio: bool, carried: tuple[int | None, dict[str, str]] = (None, {}),
                     on_remove: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The workflow control and an uploader with a preview for each of its images and clips; the spec fields.
    `carried`: (job, field -> that job's copy) of the inputs edit and re-queue brought in; each is sent, with a
    preview and a Remove button (`on_remove(field)`), until an upload replaces it."""
    job, carried_files = carried
    workflow = st.selectbox(FIELD_LABELS["generate.workflow"], WORKFLOWS, key="run_gen_workflow", format_func=lambda w: f"{w}: {WORKFLOW_HELP[w]}")
    fields: dict[str, Any] = {"workflow": workflow}
    names = WORKFLOW_INPUTS[workflow] + WORKFLOW_CLIPS[workflow]
    cols = st.columns(max(len(names), 1))
    for col, name in zip(cols, names):
        clip = name in WORKFLOW_CLIPS[workflow]
        limit = upload_limit(clip)
        # max_upload_size (in Streamlit's MB, which are MiB) makes the browser refuse a larger file before sending
        # it; the server's own cap is the global server.maxUploadSize, so save_upload checks the size again.
        upload = col.file_uploader(
            CLIP_LABELS[name] if clip else INPUT_LABELS[name], key=f"run_gen_{name}",
            type=list(CLIP_FORMATS) if clip else IMAGE_TYPES, max_upload_size=limit // fmt.MIB,
            help=(f"resampled to 24 fps and cut to the clip's frames as diffusers does" if clip
                  else "resized onto the canvas the way diffusers does"))
        col.caption(f"{' or '.join(f.upper() for f in CLIP_FORMATS)}, up to {fmt.gib(limit)} and "
                    f"{MAX_CLIP_SECONDS:g} s" if clip else f"PNG, JPEG or WebP, up to {fmt.gib(limit)}")
        if upload is not None:
            try:
                fields[name] = str(save_upload(data_dir, upload.name, upload.size, upload.getvalue, clip))
            except UploadError as e:
                col.error(str(e), icon=":material/error:")
                continue
            _preview(col, clip, upload.getvalue(), upload.name)
        elif name in carried_files:
            fields[name] = carried_files[name]
            _preview(col, clip, carried_files[name], f"{Path(carried_files[name]).name} from job {job}")
            col.button("Remove", key=f"run_gen_remove_{name}", icon=":material/close:", on_click=on_remove,
                       args=(name,), help="Send no file for this input (or upload another to replace it)")
    return fields


def _preview(col, clip: bool, media, caption: str) -> None:
    """An input's preview: the clip played, the image shown."""
    if clip:
        col.video(media)
        col.caption(caption)
    else:
        col.image(media, caption=caption, width="stretch")


def output_videos(artifacts: list[dict]) -> list[dict]:
    """The job's own MP4s: a reference clip copied in as an input (`ref_video.mp4`) is an artifact too, and is
    listed before the output because it is copied at submit."""
    return [a for a in artifacts if a["name"].endswith(".mp4") and a["name"].rpartition(".")[0] not in INPUT_FILE_FIELDS]


def input_strip(artifacts: list[dict], path_of) -> None:
    """The job's input images and clip side by side (`path_of(name)` gives an artifact's file)."""
    labels = {**INPUT_LABELS, **CLIP_LABELS}
    shown = [(a["name"], labels.get(a["name"].rpartition(".")[0]), a["media_type"].startswith("video/"))
             for a in artifacts if a["media_type"].startswith(("image/", "video/"))]
    shown = [item for item in shown if item[1] is not None]
    if not shown:
        return
    cols = st.columns(len(shown))
    for col, (name, label, clip) in zip(cols, shown):
        if clip:
            col.video(str(path_of(name)))
            col.caption(f"{label} ({name})")
        else:
            col.image(str(path_of(name)), caption=f"{label} ({name})", width="stretch")
