"""The Run page's checks before and at Queue: will it fit (the bar), the submit check's verdict and seconds,
the Queue button itself, and whether the worker, checkpoint, device and disk are ready."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from typing import Any

import streamlit as st

from dashboard import data, nav
from dashboard import format as fmt
from dashboard.form_state import ERRORS_KEY, key
from dashboard.host import read_host_memory
from dashboard.charts.style import readable
from dashboard.charts.host import fit_bar
from dashboard.views import eta as ev
from dashboard.views import fit
from dashboard.views.checkpoints import CheckpointChoice
from dashboard.views.jobs import describe_supervisor
from dashboard.views.run import CHECKPOINT_DTYPE, field_label
from dashboard.views.spec import field_errors
from core.errors import DrainboardError
from dashboard.views.plan import plan_markdown
from models.speed.plan import plan_note
from jobs.admission import JobRefused, admit, assess
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
    theme = st.context.theme.type
    st.altair_chart(readable(fit_bar(shown.base, guess.predicted_peak, shown.base + guess.wall.allowance,
                                     shown.caption, guess.share, theme), theme), width="stretch")
    {"ok": st.success, "tight": st.warning, "over": st.error}[guess.level](guess.message)
    notes = []
    if kind == "load" and guess.level == "over":
        peaks = fit.load_peaks(str(choice.path), component=component or None, device=device, roots=[choice.root],
                               dtype=None if dtype == CHECKPOINT_DTYPE else dtype)
        cheaper = fit.cheaper_mode(mode, peaks, int(found["need"]), guess.wall.allowance) if peaks else None
        if cheaper:
            notes.append(cheaper)
    process = found.get("process") or {}
    if found.get("startup") is not None:
        notes.append(f"Each wall on host memory counts the job's process as the memory guard does: it grows by "
                     f"{fmt.gib(found['startup'])} before its first weight ({process.get('basis')} on this machine).")
    if kind == "generate" and found.get("job_peak"):
        notes.append(f"The whole job, its process included, should peak at {fmt.gib(found['job_peak'])}.")
    if found.get("not_counted"):
        notes.append("Not counted: " + "; ".join(found["not_counted"]) + ".")
    st.caption(" ".join(notes))


@st.cache_data(ttl=10, show_spinner="Forecasting…")
def admission(spec_json: str, db: str) -> dict | None:
    """jobs.admission.assess of a spec (as JSON, so it caches): the forecast, its refusal and seconds; with a plan,
    of the candidate the plan chooses, and the plan itself (`planned`)."""
    spec = JobSpec.from_dict(json.loads(spec_json))
    try:  # forced: a plan that finds nothing that fits still says what it weighed
        spec = spec.job_kind.prepare(replace(spec, forced=True), data.config(), connect(db))
    except (DrainboardError, ValueError, OSError):
        pass  # a checkpoint the forecast cannot read: the Queue button's check names the file
    found = assess(spec, data.config(), connect(db))
    return None if found is None else found.to_dict() | {"planned": getattr(spec.options, "planned", None)}


def plan_panel(found: dict | None) -> None:
    """`Plan: fastest that fits`: every candidate with its peaks and seconds, the chosen one marked, those that
    cannot fit struck through with their stage, and why."""
    planned = (found or {}).get("planned")
    if not planned:
        return
    st.subheader("Plan", anchor=False)
    st.markdown(plan_markdown(planned))
    note = plan_note(planned)
    st.caption(f"{note[:1].upper()}{note[1:]}.")
    choice = planned["chosen"]
    why = planned["why"]
    line = f"Runs {planned['candidates'][choice]['label']}: {why}." if choice is not None else \
        f"{why[:1].upper()}{why[1:]}."  # the fit verdict of the first candidate
    (st.caption if choice is not None else st.error)(line)


def checked(raw: dict[str, Any], choice: CheckpointChoice | None) -> tuple[JobSpec | None, dict[str, list[str]]]:
    """The form as it stands, checked as submit checks it (build_spec), on every change: (its spec, or None
    while it cannot be built, and each field's messages)."""
    if choice is None or not choice.ok:
        return None, {}
    try:
        return build_spec({**raw, "forced": False}, data.config()), {}
    except JobSpecError as e:
        return None, field_errors(e.errors)


def assessed(spec: JobSpec | None, db: str) -> dict | None:
    """The submit check of the form's spec (its Admission dict), or None while there is no spec."""
    return None if spec is None else admission(json.dumps(spec.to_dict()), db)


def named(errors: dict[str, list[str]]) -> str:
    """`Width: must be a multiple of 32; Prompt: a prompt is required`: each field by its label on the form (the
    forecast's refusal says its own subject)."""
    return "; ".join(message if name == "forecast" else f"{field_label(name)}: {message}"
                     for name, messages in errors.items() for message in messages)


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


def queue_button(raw: dict[str, Any], choice: CheckpointChoice | None, db: str,
                 errors: dict[str, list[str]]) -> None:
    """Queue job, off while the checkpoint is refused or a field has a problem (`errors`, said under each field
    and named here): build and validate the spec, check its forecast fits (or that it is forced), enqueue, go to
    the job's page."""
    blocked = "The loader refuses the chosen checkpoint (see under it)." if choice is None or not choice.ok else (
        f"Fix first: {named(errors)}" if errors else None)
    if st.button("Queue job", type="primary", icon=":material/play_arrow:", key=key("submit"),
                 disabled=blocked is not None, help=blocked):
        connection = connect(db)
        submitted = {**raw, "forced": bool(st.session_state.get(key("forced")))}
        try:
            spec = admit(build_spec(submitted, data.config()), data.config(), connection)
        except JobSpecError as e:
            st.session_state[ERRORS_KEY] = {"spec": submitted, "errors": field_errors(e.errors)}
            st.rerun()
        except JobRefused as e:
            # *Will it fit?* above says what the job needs, once; this says only that nothing was queued for it.
            said = str(e) if e.admission is None else "it does not fit (see *Will it fit?*)"
            st.session_state[ERRORS_KEY] = {"spec": submitted, "errors": {"forecast": [said]}}
            st.rerun()
        st.session_state.pop(ERRORS_KEY, None)
        job_id = queue_spec(connection, spec, data.config().data_dir)
        data.jobs.clear()
        st.toast(f"Queued job {job_id}")
        nav.goto("job", job=str(job_id))
    if blocked and errors:
        st.caption(f"Nothing can be queued yet. {blocked}")
    refused = submit_errors(raw)
    if refused:
        st.error(f"Nothing was queued: {named(refused)}")


def submit_errors(raw: dict[str, Any]) -> dict[str, list[str]]:
    """The messages of the last refused submit while the form is still as it was submitted; a change clears them."""
    last = st.session_state.get(ERRORS_KEY)
    if not last:
        return {}
    if {k: v for k, v in last["spec"].items() if k != "forced"} != raw:
        st.session_state.pop(ERRORS_KEY, None)
        return {}
    return last["errors"]


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
