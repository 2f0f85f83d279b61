"""Run: choose a checkpoint and settings, see whether it will fit, queue the job.

The loader checks the chosen checkpoint before anything can be queued; the rest is
validated by jobs.spec.build_spec, each message beside its field; nothing is queued on
error. The form keeps its values across pages and refreshes (dashboard.form_state);
`?from=<job id>` fills it from that job: edit and re-queue. The fields are drawn by
dashboard.run_fields, the checks and the Queue button by dashboard.run_checks.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import data, frame, form_state, nav
from dashboard import run_checks as checks
from dashboard import run_fields as fields
from dashboard.inputs_panel import prune_uploads, queued_inputs
from dashboard.views.jobs import progress
from dashboard.views.run import DTYPES
from dashboard.views.spec import job_label
from jobs.queue import JobStateError, cancel
from machine.advice import mode_warning
from storage.connections import connect


@st.fragment(run_every=frame.LIVE_EVERY)
def queue_panel(db: str) -> None:
    """Running and queued jobs with Cancel: the same list, refreshed as often, as the header's chip."""
    st.subheader("Queue", anchor=False)
    waiting = data.active_jobs(db)
    if not waiting:
        st.caption("Nothing running or queued.")
    for job in waiting:
        with st.container(border=True):
            top, button = st.columns([4, 1], vertical_alignment="center")
            where = progress(job).text
            top.markdown(f"[{job_label(job)}]({nav.link('job', job=str(job['id']))}) · {job['status']}"
                         + (f" · {where}" if where else ""))
            if button.button("Cancel", key=f"cancel_{job['id']}"):
                try:
                    cancel(connect(db), job["id"])
                except JobStateError as e:
                    st.warning(str(e))
                data.jobs.clear()
                st.rerun()


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
        component = fields.component_field(choice)
        kind, mode = fields.job_fields()
        device, dtype = fields.device_fields(data.devices())
        slow = mode_warning(mode, device)
        if slow:
            text = slow.removeprefix("warning: ")
            st.warning(text[:1].upper() + text[1:], icon=":material/speed:")
        raw: dict[str, Any] = {
            "kind": kind, "model": str(choice.path) if choice else "", "component": component, "mode": mode,
            "device": device.spec, "dtype": None if dtype == DTYPES[0] else dtype,
            **fields.limit_fields(device, kind, mode),
        }
        if kind == "generate":
            raw["generate"] = fields.generate_fields(choice, device, raw.get("sequential_components"))
        raw["offload"] = fields.offload_fields(device)
        form_state.keep_drawn()
    form_state.mirror_in_url()
    with side:
        found = checks.assessed(raw, choice, db)
        with st.container():  # a fixed slot: the button below keeps its place whatever the forecast draws
            checks.fit_panel(choice, kind, component, mode, device, dtype, db, found)
            checks.forecast_panel(found)
        checks.queue_button(raw, choice, db)
        checks.ready_panel(choice, device, db)
        queue_panel(db)


main()
