"""Run: choose a checkpoint and settings, see whether it will fit, queue the job.

The loader checks the chosen checkpoint before anything can be queued; the rest is
validated by jobs.spec.build_spec, each message beside its field; nothing is queued on
error. The form keeps its values across pages and refreshes (dashboard.form_state);
`?from=<job id>` fills it from that job: edit and re-queue. The fields are drawn by
dashboard.run_fields, the checks and the Queue button by dashboard.run_checks.
"""

from __future__ import annotations

import io
from typing import Any

import streamlit as st

from core.echo import echo
from dashboard import data, frame, form_state, nav
from dashboard import format as fmt
from dashboard import run_checks as checks
from dashboard import run_fields as fields
from dashboard.inputs_panel import prune_uploads, queued_inputs
from dashboard.views.jobs import progress, queue_places
from dashboard.views.run import CHECKPOINT_DTYPE
from dashboard.views.spec import job_label
from jobs.queue import JobStateError, cancel, clear_queue, move_to_front
from loader.placement.advice import mode_warning
from models.inputs.clips import MAX_CLIP_BYTES
from models.video.settings import VideoSettingsError, read_video_settings
from storage.connections import connect


CLEAR_KEY = "run_clear_queue"  # session key: the queued ids the user is asked to confirm clearing


@st.fragment(run_every=frame.LIVE_EVERY)
def queue_panel(db: str) -> None:
    """Running and queued jobs (the same list, refreshed as often, as the header's chip): each queued job's place
    and what it waits behind, Move to front, Cancel, and Clear the queue."""
    st.subheader("Queue", anchor=False)
    waiting = data.active_jobs(db)
    if not waiting:
        st.caption("Nothing running or queued.")
    places = queue_places(waiting)
    first_queued = next((j["id"] for j in waiting if j["status"] == "queued"), None)
    for job in waiting:
        with st.container(border=True):
            top, buttons = st.columns([3, 2], vertical_alignment="center")
            where = progress(job).text if job["status"] == "running" else places.get(job["id"], "")
            top.markdown(f"[{job_label(job)}]({nav.link('job', job=str(job['id']))}) · {job['status']}"
                         + (f" · {where}" if where else ""))
            row = buttons.container(horizontal=True, horizontal_alignment="right")
            if job["status"] == "queued" and job["id"] != first_queued and row.button(
                    "To front", key=f"front_{job['id']}", icon=":material/vertical_align_top:",
                    help="Move it to the front of the queue: the next job a worker takes"):
                act(lambda: move_to_front(connect(db), job["id"]))
            if row.button("Cancel", key=f"cancel_{job['id']}"):
                act(lambda: cancel(connect(db), job["id"]))
    queued = [j["id"] for j in waiting if j["status"] == "queued"]
    if len(queued) > 1:
        clear_queue_button(db, queued)


def act(change) -> None:
    """Run a queue change, say in one line why it could not be made, and draw the queue again."""
    try:
        change()
    except JobStateError as e:
        st.warning(str(e))
        return
    data.jobs.clear()
    st.rerun()


def clear_queue_button(db: str, queued: list[int]) -> None:
    """Clear the queue, after a confirmation naming what it cancels (a running job keeps running)."""
    asked = st.session_state.get(CLEAR_KEY)
    if asked is None:
        if st.button(f"Clear the queue ({len(queued)} queued)", key="run_clear_queue_button", icon=":material/clear_all:"):
            st.session_state[CLEAR_KEY] = queued
            st.rerun()
        return
    st.warning(f"Cancel the {len(asked)} queued jobs ({', '.join(map(str, asked))})? A running job keeps running.")
    yes, no = st.columns(2)
    if yes.button("Cancel them", type="primary", key="run_clear_queue_confirm"):
        st.session_state.pop(CLEAR_KEY)
        cleared = clear_queue(connect(db))
        st.toast(f"Cancelled {len(cleared)} queued job(s)")
        data.jobs.clear()
        st.rerun()
    if no.button("Keep them", key="run_clear_queue_keep"):
        st.session_state.pop(CLEAR_KEY)
        st.rerun()


def video_drop(config) -> None:
    """A Drainboard MP4 dropped here fills the form with the settings it carries (models.video.settings)."""
    with st.expander("Fill the form from a Drainboard video", icon=":material/movie:"):
        video = st.file_uploader("A Drainboard MP4", type=["mp4"], key="run_video_settings",
                                 max_upload_size=MAX_CLIP_BYTES // 2**20,
                                 help="Its prompt, seed, workflow, size, frames, steps, LoRAs and checkpoint fill the form")
        st.caption(f"MP4, up to {fmt.gib(MAX_CLIP_BYTES)}: the video is read, not kept.")
        if video is None:
            return
        if video.size > MAX_CLIP_BYTES:
            st.error(f"{echo(video.name)} is {fmt.gib(video.size)}: videos up to {fmt.gib(MAX_CLIP_BYTES)} are read.")
            return
        try:
            settings = read_video_settings(io.BytesIO(video.getvalue()))
        except VideoSettingsError as e:
            st.error(f"{echo(video.name)}: {e}", icon=":material/error:")
            return
        if settings is None:
            st.warning(f"{echo(video.name)} carries no Drainboard settings (it was not made by a Drainboard job).")
            return
        names = {c.path.name: str(c.path) for c in data.checkpoints(tuple(str(r) for r in config.model_roots))}
        st.success(form_state.fill_from_video(video.file_id, settings, names), icon=":material/edit:")


def main() -> None:
    config = data.config()
    db = data.db_path()
    st.title("Run a job", anchor=False)
    form_state.start_run()
    prune_uploads(config.data_dir, queued_inputs(data.active_jobs(db)))
    form_state.fill_from_query(db)
    filled = st.session_state.get(form_state.FROM_KEY)
    if filled is not None:
        st.info(f"Filled from job {filled}: change what you like and queue it as a new job.", icon=":material/edit:")
    form, side = st.columns([3, 2], gap="large")
    with form:
        choice = fields.checkpoint_field(data.checkpoints(tuple(str(r) for r in config.model_roots)), config.model_roots)
        kind, mode = fields.job_fields()
        component = fields.component_field(choice) if kind == "load" else None  # a generate loads every component
        device, dtype = fields.device_fields(data.devices())
        slow = mode_warning(mode, device)
        if slow:
            text = slow.removeprefix("warning: ")
            st.warning(text[:1].upper() + text[1:], icon=":material/speed:")
        raw: dict[str, Any] = {
            "kind": kind, "model": str(choice.path) if choice else "", "component": component, "mode": mode,
            "device": device.spec, "dtype": None if dtype == CHECKPOINT_DTYPE else dtype,
            **fields.limit_fields(device, kind, mode),
        }
        if kind == "generate":
            raw["generate"] = fields.generate_fields(choice, device, raw.get("sequential_components"))
            raw |= fields.plan_fields()
        raw |= fields.kind_option_fields(kind)
        raw["offload"], offload_slot = fields.offload_fields(device, kind)
        form_state.keep_drawn()
    form_state.mirror_in_url()
    spec, errors = checks.checked(raw, choice)
    form_state.fill_errors(errors)  # under each field, as they change; Queue job names them all while it is off
    fields.offload_table(offload_slot, spec, device)  # what the job will do: fit-aware for a discrete-GPU generate
    with side:
        found = checks.assessed(spec, db)
        with st.container():  # a fixed slot: the button below keeps its place whatever the forecast draws
            checks.fit_panel(choice, kind, component, mode, device, dtype, db, found)
            checks.forecast_panel(found)
            checks.plan_panel(found)
        checks.queue_button(raw, choice, db, errors)
        checks.ready_panel(choice, device, db)
        video_drop(config)  # after Queue job: it is not on the way there for a keyboard user
        queue_panel(db)


main()
