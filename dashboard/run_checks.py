"""The Run page's checks before and at Queue: will it fit (the bar), the submit check's verdict and seconds,
the Queue button itself, and whether the worker, checkpoint, device and disk are ready."""

from __future__ import annotations

import json
import shutil
from typing import Any

import streamlit as st

from dashboard import data, nav
from dashboard import format as fmt
from dashboard.form_state import ERRORS_KEY, key
from dashboard.host import read_host_memory
from dashboard.host_charts import fit_bar
from dashboard.views import eta as ev
from dashboard.views import fit
from dashboard.views.checkpoints import CheckpointChoice
from dashboard.views.jobs import describe_supervisor
from dashboard.views.run import DTYPES
from dashboard.views.spec import field_errors
from jobs.admission import JobRefused, admit, assess, remedy
from jobs.queue import queue_spec
from jobs.spec import JobSpec, JobSpecError, build_spec
from machine.device import DeviceInfo
from storage.connections import connect


def fit_panel(choice: CheckpointChoice | None, kind: str, component: str | None, mode: str, device: DeviceInfo,
              dtype: str, db: str, found: dict | None) -> None:
    """Will it fit: the submit check's own verdict (`found`: its Admission dict) as a bar and one line, for a
    load with a cheaper mode that fits when the chosen one does not."""
    st.subheader("Will it fit?", anchor=False)  # no heading link: one Tab stop fewer before Queue job
    if choice is None or not choice.ok:
        st.caption("Choose a sound checkpoint to see a forecast.")
        return
    if found is None or not found.get("tightest"):
        st.caption("No forecast for these settings yet: the fields the Queue button names must be fixed first.")
        return
    shown = fit.submit_fit(found, read_host_memory().in_use)
    guess = shown.forecast
    st.altair_chart(fit_bar(shown.base, guess.predicted_peak, shown.base + guess.wall.allowance, shown.caption,
                            guess.share), width="stretch")
    {"ok": st.success, "tight": st.warning, "over": st.error}[guess.level](guess.message)
    notes = []
    if kind == "load" and guess.level == "over":
        peaks = fit.load_peaks(str(choice.path), component=component or None, device=device, roots=[choice.root],
                               dtype=None if dtype == DTYPES[0] else dtype)
        cheaper = fit.cheaper_mode(mode, peaks, int(found["need"]), guess.wall.allowance) if peaks else None
        if cheaper:
            notes.append(cheaper)
    process = found.get("process") or {}
    if found.get("startup") is not None:
        notes.append(f"Each wall on host memory counts the job's process as the memory guard does: it grows by "
                     f"{fmt.gib(found['startup'])} before its first weight ({process.get('basis')} on this machine).")
    if kind == "generate" and found.get("job_peak"):
        notes.append(f"The whole job, its process included, should peak at {fmt.gib(found['job_peak'])}.")
    st.caption(" ".join(notes))


@st.cache_data(ttl=10, show_spinner="Forecasting…")
def admission(spec_json: str, db: str) -> dict | None:
    """jobs.admission.assess of a spec (as JSON, so it caches): the forecast, its refusal and seconds."""
    found = assess(JobSpec.from_dict(json.loads(spec_json)), data.config(), connect(db))
    return None if found is None else found.to_dict()


def assessed(raw: dict[str, Any], choice: CheckpointChoice | None, db: str) -> dict | None:
    """The submit check of the form as it stands (its Admission dict), or None while it cannot be built."""
    if choice is None or not choice.ok:
        return None
    try:
        spec = build_spec({**raw, "forced": False}, data.config())
    except JobSpecError:
        return None  # the queue button names the bad fields
    return admission(json.dumps(spec.to_dict()), db)


def forecast_panel(found: dict | None) -> None:
    """The submit check before Queue is pressed: the refusal in red with its numbers, a checkbox to queue
    anyway, and a generate's predicted seconds per stage."""
    if found is None:
        return
    if found["refusal"]:  # the fit panel above says what it needs, once
        st.checkbox("Queue anyway", key=key("forced"),
                    help="Queue it over the forecast; the job records that it was forced. The memory guard still "
                         "stops it if it crosses the budget or the floor.")
    if found["eta"]:
        st.caption(ev.duration_summary(found))
        st.dataframe(ev.duration_rows(found), hide_index=True, width="stretch", key=key("durations"))


def queue_button(raw: dict[str, Any], choice: CheckpointChoice | None, db: str) -> None:
    """Queue job: build and validate the spec, check its forecast fits (or that it is forced), enqueue, go to
    the job's page."""
    blocked = choice is None or not choice.ok
    if st.button("Queue job", type="primary", icon=":material/play_arrow:", key=key("submit"), disabled=blocked,
                 help="The loader refuses the chosen checkpoint (see under it)." if blocked else None):
        connection = connect(db)
        try:
            spec = admit(build_spec({**raw, "forced": bool(st.session_state.get(key("forced")))}, data.config()),
                         data.config(), connection)
        except JobSpecError as e:
            st.session_state[ERRORS_KEY] = field_errors(e.errors)
            st.rerun()
        except JobRefused as e:
            need = e.admission.need
            st.session_state[ERRORS_KEY] = {"forecast": [
                f"needs {fmt.gib(need)}: {remedy(e.admission.tightest.wall, need, cli=False)}"]}
            st.rerun()
        st.session_state.pop(ERRORS_KEY, None)
        job_id = queue_spec(connection, spec, data.config().data_dir)
        data.jobs.clear()
        st.toast(f"Queued job {job_id}")
        nav.goto("job", job=str(job_id))
    errors = st.session_state.get(ERRORS_KEY)
    if errors:
        st.error("Nothing was queued: " + "; ".join(f"{k}: {m}" for k, ms in errors.items() for m in ms))


def ready_panel(choice: CheckpointChoice | None, device: DeviceInfo, db: str) -> None:
    config = data.config()
    st.subheader("Ready?", anchor=False)
    supervisor = data.supervisor(db)
    host_total = read_host_memory().total
    disk = shutil.disk_usage(config.data_dir if config.data_dir.exists() else config.data_dir.parent)
    where = "host memory, MemTotal" if device.kind == "cpu" else "unified: GPU and CPU share one pool" if device.unified_memory else "device memory"
    checks = [
        (supervisor["alive"], f"Worker: {describe_supervisor(supervisor)}"),
        (choice is not None and choice.ok,
         "Checkpoint: none chosen" if choice is None else
         f"Checkpoint {choice.path.name}: headers valid ({fmt.gib(choice.total_bytes)})" if choice.ok else
         f"Checkpoint {choice.path.name}: {len(choice.problems)} problem(s), see under the picker"),
        (device.total_memory is not None, f"Capacity {fmt.gib(device.total_memory or host_total)} on {device.spec} ({where})"),
        (disk.free > 2 * fmt.GIB, f"Free disk for outputs: {fmt.gib(disk.free)}"),
    ]
    for ok, text in checks:
        st.markdown(f"{':material/check_circle:' if ok else ':material/error:'} {text}")
