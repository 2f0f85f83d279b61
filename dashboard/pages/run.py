"""Run: choose a checkpoint and settings, see whether it will fit, queue the job.

The loader checks the chosen checkpoint before anything can be queued; the rest is
validated by jobs.spec.build_spec, each message beside its field; nothing is queued on
error. The form's values live in session state under FORM_KEY (widget keys are dropped
when the page is left, so they would be forgotten) and the main ones in the URL (which
survives a refresh); `?from=<job id>` fills the form from that job: edit and re-queue.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import streamlit as st

from dashboard import data, frame, nav
from dashboard import format as fmt
from dashboard import words
from dashboard.host import read_host_memory
from dashboard.host_charts import fit_bar, wall_caption
from dashboard.views import eta as ev
from dashboard.inputs_panel import workflow_section
from dashboard.views import fit, query
from dashboard.views.checkpoints import CheckpointChoice, components_table, outside_roots
from dashboard.views.jobs import describe_supervisor, progress
from dashboard.views.run import (
    DEFAULT_COMPONENT, DTYPES, GENERATE_FIELDS, KIND_LABELS, MODE_HELP, OFFERED_FLAGS, POLICY_DEFAULT, TRISTATE,
    form_values, generate_defaults, generate_geometry, offload_preview, offload_summary,
)
from dashboard.views.spec import field_errors, job_label
from jobs.admission import JobRefused, admit, assess
from jobs.kinds import kind_names
from jobs.queue import JobStateError, cancel, queue_spec
from jobs.spec import JobSpec, JobSpecError, build_spec
from machine.advice import mode_warning
from machine.device import DeviceInfo
from machine.offload import OffloadSettings
from core.sizes import parse_size
from storage.connections import connect

# Session keys (a page script must not hold bare strings: Streamlit would draw them).
FORM_KEY = "run_form"  # field -> value of the form, kept while the user is on other pages
FROM_KEY = "run_filled_from"  # id of the job whose spec filled the form (applied once per arrival)
ERRORS_KEY = "run_errors"  # field -> messages from the last rejected submit
# Fields mirrored in the query string, so a refreshed or shared URL opens the same form.
URL_FIELDS = ("checkpoint", "component", "kind", "mode", "device", "dtype")
DEFAULT_PROMPT = "a red fox trotting through fresh snow at dawn, soft light"
MODES = ("stream", "drain", "retain")


def key(name: str) -> str:
    """The widget key of a form field."""
    return f"run_{name}"


def durable() -> dict[str, Any]:
    return st.session_state.setdefault(FORM_KEY, {})


_drawn: list[str] = []  # fields drawn in this run (the script runs afresh each time), kept at its end


def seed(name: str, default: Any, options: list | tuple | None = None) -> None:
    """Give a widget its value before it is drawn: what it had, else the kept form value,
    else `default`; a value no longer among `options` falls back to `default`."""
    _drawn.append(name)
    value = st.session_state.get(key(name), durable().get(name, default))
    if options is not None and value not in options:
        value = default
    st.session_state[key(name)] = value


def keep(names: list[str]) -> None:
    """Remember these fields' values for the next visit."""
    durable().update({name: st.session_state[key(name)] for name in names if key(name) in st.session_state})


def keep_selection(name: str) -> None:
    """on_change of a segmented control: clicking the selected option must not leave nothing selected."""
    if st.session_state.get(key(name)) is None:
        st.session_state[key(name)] = durable().get(name)


def fill_from_query(db: str) -> None:
    """Apply `?from=<job id>` once per id (its spec fills every field), or, on a fresh session,
    the fields mirrored in the URL."""
    raw = st.query_params.get("from")
    try:
        job_id = None if raw is None else query.job_id(raw, name="from")
    except query.QueryError as e:
        st.warning(f"{e}. The form keeps its values.")
        job_id = None
    if job_id is None:
        st.session_state.pop(FROM_KEY, None)  # arriving with ?from= again fills the form again
    elif st.session_state.get(FROM_KEY) != job_id:
        job = data.job(db, job_id)
        if job is None:
            st.warning(f"There is no job {job_id} to fill the form from.")
        else:
            values = form_values(job["spec"])
            durable().update(values)
            for name in values:
                st.session_state.pop(key(name), None)  # seed() takes the job's value (if still offered)
            st.session_state[FROM_KEY] = job_id
    if not durable():
        durable().update({name: st.query_params[name] for name in URL_FIELDS if st.query_params.get(name)})


def mirror_in_url() -> None:
    """The main fields into the query string (`from` stays while the form is filled from it)."""
    params = {name: str(durable()[name]) for name in URL_FIELDS if durable().get(name) not in (None, "")}
    if st.session_state.get(FROM_KEY) is not None:
        params["from"] = str(st.session_state[FROM_KEY])
    if dict(st.query_params) != params:
        st.query_params.from_dict(params)


def show_errors(*names: str) -> None:
    """Messages for these fields from the last rejected submit, right under the widget."""
    errors = st.session_state.get(ERRORS_KEY, {})
    for name in names:
        for message in errors.get(name, []):
            st.error(message, icon=":material/error:")


def checkpoint_field(choices: list[CheckpointChoice], roots: list) -> CheckpointChoice | None:
    """The checkpoint picker, with the loader's verdict on the chosen one right under it."""
    if not choices:
        st.warning(
            "No checkpoint found under the model roots: " + ", ".join(str(r) for r in roots)
            + ". Write one with `python -m models synth DIR --profile demo` or set DRAINBOARD_MODEL_ROOTS."
        )
        return None
    by_path = {str(c.path): c for c in choices}
    usable = [c for c in choices if c.ok]
    default = next((c for c in usable if c.path.name == "demo"), usable[0] if usable else choices[0])
    wanted = durable().get("checkpoint")
    if wanted and wanted not in by_path:
        st.warning(f"{outside_roots(wanted, roots)} {default.path.name} is chosen instead.")
        durable()["checkpoint"] = str(default.path)
    seed("checkpoint", str(default.path), list(by_path))
    choice = by_path[st.selectbox("Checkpoint", list(by_path), format_func=lambda p: by_path[p].label, key=key("checkpoint"))]
    show_errors("model")
    if not choice.ok:
        st.error(
            f"The loader refuses {choice.path}: it cannot be queued.\n\n" + "\n".join(f"- {p}" for p in choice.problems[:20])
            + (f"\n- … and {len(choice.problems) - 20} more" if len(choice.problems) > 20 else ""),
            icon=":material/error:",
        )
    else:
        tensors = sum(c.tensors for c in choice.components)
        with st.expander(f"Components of {choice.path.name} ({fmt.gib(choice.total_bytes)}, {tensors:,} tensors: headers valid)"):
            st.dataframe(components_table(choice), hide_index=True, width="stretch")
    broken = [c for c in choices if not c.ok]
    if broken and len(broken) < len(choices):
        st.caption(f"{len(broken)} broken checkpoint(s) under the roots are listed with ✗.")
    return choice


def component_field(choice: CheckpointChoice | None) -> str | None:
    """Which component a load job loads, when the checkpoint has several."""
    if choice is None or len(choice.components) < 2:
        return None
    options = ([DEFAULT_COMPONENT] if choice.default_component else []) + [c.name for c in choice.components]
    seed("component", options[0], options)
    picked = st.selectbox(
        "Component to load", options, key=key("component"),
        format_func=lambda c: f"(default: {choice.default_component})" if c == DEFAULT_COMPONENT else c,
        help="A load job loads one component; a generate job loads every component.",
    )
    show_errors("component")
    return picked or None


def job_fields() -> tuple[str, str]:
    """Job kind and placement mode (neither can be un-selected)."""
    names = kind_names()
    kinds = [k for k in KIND_LABELS if k in names] + [k for k in names if k not in KIND_LABELS]
    seed("kind", "load", kinds)
    seed("mode", "stream", MODES)
    keep(["kind", "mode"])  # keep_selection restores these
    kind = st.segmented_control(
        "Job", kinds, format_func=lambda k: KIND_LABELS.get(k, k), key=key("kind"), on_change=keep_selection, args=("kind",)
    )
    show_errors("kind")
    mode = st.segmented_control("Placement mode", MODES, key=key("mode"), on_change=keep_selection, args=("mode",))
    st.caption(MODE_HELP[mode])
    show_errors("mode")
    return kind, mode


def device_fields(devices: list[DeviceInfo]) -> tuple[DeviceInfo, str]:
    by_spec = {d.spec: d for d in devices}
    seed("device", devices[0].spec, list(by_spec))
    seed("dtype", DTYPES[0], DTYPES)
    left, right = st.columns(2)
    spec = left.selectbox(
        "Device", list(by_spec), key=key("device"),
        format_func=lambda s: f"{s} — {by_spec[s].name}" + (" (unified memory)" if by_spec[s].unified_memory and by_spec[s].kind != "cpu" else ""),
    )
    show_errors("device")
    dtype = right.selectbox("dtype", DTYPES, key=key("dtype"), help="Target dtype; the checkpoint's own keeps bytes unchanged.")
    show_errors("dtype")
    return by_spec[spec], dtype


def limit_fields(device: DeviceInfo, kind: str, mode: str) -> dict[str, Any]:
    """Sampling, the memory limit, the GPU count and the guard, as the spec's raw fields."""
    seed("sample_every", 1)
    seed("memory_limit", "")
    seed("gpus", 1)
    left, right = st.columns(2)
    sample_every = left.number_input(
        "Sample memory every N tensors", min_value=1, step=1, key=key("sample_every"),
        help="1 records a sample per placed tensor (the default); generate stages also sample on a timer.",
    )
    show_errors("sample_every")
    reason = data.memory_limit_reason()
    memory_limit = right.text_input(
        "Memory limit (cgroup)", key=key("memory_limit"), disabled=reason is not None,
        placeholder="e.g. 8GiB" if reason is None else "not available here",
        help=reason or "Kill the job's process tree when it uses more than this (it counts the worker's own memory "
        "too). Empty: no limit. Sizes such as 300MB (powers of 1000) or 8GiB (powers of 1024).",
    )
    show_errors("memory_limit")
    gpus = 1
    if device.kind == "cuda":
        gpus = st.number_input("GPUs (ranks)", min_value=1, step=1, key=key("gpus"))
        show_errors("gpus")
    return {"sample_every": int(sample_every), "memory_limit": memory_limit.strip() or None, "gpus": int(gpus),
            **guard_fields(kind, mode, int(gpus))}


def guard_fields(kind: str, mode: str, gpus: int) -> dict[str, Any]:
    """The memory guard's budget and floor, and (for a one-rank stream load, the only job that applies it)
    whether to drop the page cache, and (for generate) whether to hold one component at a time, as raw spec fields."""
    seed("memory_budget", "")
    seed("memory_floor", "")
    left, right = st.columns(2)
    budget = left.text_input(
        "Memory budget (guard)", key=key("memory_budget"), placeholder="e.g. 40GiB",
        help="Stop the job when system in use grows more than this over its start. Unlike a cgroup limit it "
             "counts CUDA allocations on unified memory. Empty: no budget.",
    )
    show_errors("memory_budget")
    floor = right.text_input(
        "MemAvailable floor (guard)", key=key("memory_floor"), placeholder="configured floor",
        help="Stop the job when MemAvailable falls below this; empty keeps the configured floor.",
    )
    show_errors("memory_floor")
    raw: dict[str, Any] = {"memory_budget": budget.strip() or None, "memory_floor": floor.strip() or None}
    if kind == "load" and mode == "stream" and gpus == 1:
        raw["drop_page_cache"] = policy_choice(
            "drop_page_cache", "Drop page cache after reading",
            "Evict the checkpoint's file pages once placed, so cached bytes do not crowd the pool "
            "(the default: on for unified-memory CUDA targets).",
        )
    if kind == "generate":
        raw["sequential_components"] = policy_choice(
            "sequential_components", "One component at a time",
            "Load each component just before its first pipeline block and release it after its last, so the "
            "peak is the largest stage, not the sum (the default: on for unified memory).",
        )
    return raw


def policy_choice(field: str, label: str, help: str) -> bool | None:
    """A bool spec field the policy decides unless the user says on or off: None, True or False."""
    seed(field, POLICY_DEFAULT, list(TRISTATE))
    choice = st.selectbox(label, list(TRISTATE), key=key(field), help=help)
    show_errors(field)
    return TRISTATE[choice]


def generate_fields(choice) -> dict[str, Any]:
    """The clip to generate (MiniMax H3 t2va, fl2va or ref2va), as the spec's `generate` mapping."""
    canvas, multiple = generate_geometry(str(choice.path) if choice else None)
    defaults = generate_defaults(DEFAULT_PROMPT, canvas)
    for name, value in defaults.items():
        seed(name, value)
    st.subheader("Generate")
    st.text_area("Prompt", key=key("gen_prompt"), height=80)
    show_errors("generate.prompt")
    cols = st.columns(4)
    cols[0].number_input("Frames (24 fps)", min_value=124, max_value=345, step=17, key=key("gen_frames"),
                         help="17n + 5: 124 (5.2 s) to 345 (14.4 s)")
    canvas_help = f"a multiple of {multiple}; checkpoint default: {canvas[1]}x{canvas[0]} (width x height)"
    cols[1].number_input("Height", min_value=multiple, step=multiple, key=key("gen_height"), help=canvas_help)
    cols[2].number_input("Width", min_value=multiple, step=multiple, key=key("gen_width"), help=canvas_help)
    cols[3].number_input("Steps", min_value=2, key=key("gen_steps"),
                         help="N steps make N - 1 transformer passes (3 steps = 2 passes); the model's own default is 50")
    cols = st.columns(4)
    cols[0].number_input("Seed", min_value=0, key=key("gen_seed"))
    cols[1].toggle("Audio track", key=key("gen_audio"))
    show_errors(*[f"generate.{name}" for name in GENERATE_FIELDS if name != "prompt"], "generate")
    fields = {name: st.session_state[key(f"gen_{name}")] for name in GENERATE_FIELDS}
    fields |= workflow_section(data.config().data_dir, fields["audio"])
    show_errors("generate.workflow", "generate.image", "generate.last_image", "generate.ref_image")
    return fields


def offload_fields(device: DeviceInfo) -> dict[str, bool]:
    """The offload flags the user changed from the defaults, collapsed under a line saying what the policy
    does with them (open when the user changed one, so they see what becomes of it)."""
    defaults = OffloadSettings()
    for name in OFFERED_FLAGS:
        seed(f"offload_{name}", getattr(defaults, name))
    flags = {name: bool(st.session_state[key(f"offload_{name}")]) for name in OFFERED_FLAGS}
    preview = offload_preview(OffloadSettings(**flags), device)
    touched = any(flags[name] != getattr(defaults, name) for name in OFFERED_FLAGS)
    with st.expander(offload_summary(preview, device.spec), expanded=touched):
        cols = st.columns(2)
        for i, name in enumerate(OFFERED_FLAGS):
            cols[i % 2].checkbox(words.flag(name), key=key(f"offload_{name}"), help=name)
        show_errors("offload")
        st.caption(device.reason)
        st.dataframe(
            preview, hide_index=True, width="stretch",
            column_config={"requested": st.column_config.CheckboxColumn(), "used": st.column_config.CheckboxColumn()},
        )
    # Only the flags the user changed are set: the policy (fit-aware on a discrete GPU) decides the others.
    return {name: value for name, value in flags.items() if value != getattr(defaults, name)}


def typed_size(name: str) -> int | None:
    """A size field's bytes for the forecast (None when empty or not a size: build_spec says why on submit)."""
    text = str(st.session_state.get(key(name)) or "").strip()
    try:
        return parse_size(text) if text else None
    except ValueError:
        return None


def fit_panel(choice: CheckpointChoice | None, kind: str, component: str | None, mode: str, device: DeviceInfo,
              dtype: str, db: str) -> None:
    """Will it fit: the chosen mode's predicted peak against the tightest wall, and a cheaper mode when not."""
    st.subheader("Will it fit?")
    if choice is None or not choice.ok:
        st.caption("Choose a sound checkpoint to see a forecast.")
        return
    host = read_host_memory()
    capacity = device.total_memory or host.total
    limit = typed_size("memory_limit")
    guard = data.guard_limits(typed_size("memory_budget"), typed_size("memory_floor"), host.total)
    found = fit.walls(in_use=host.in_use, capacity=capacity, limit=limit,
                      limit_baseline=(data.worker_baseline(db) or 0) if limit else 0,
                      budget=guard.budget, floor=guard.floor)
    peaks = None
    if kind == "load":
        peaks = fit.load_peaks(str(choice.path), component=component or None, device=device, roots=[choice.root],
                               dtype=None if dtype == DTYPES[0] else dtype)
    guess = fit.forecast(mode, peaks or fit.mode_peaks(choice.bytes_to_place(kind, component)), found)
    st.altair_chart(
        fit_bar(host.in_use, guess.predicted_peak, host.in_use + guess.wall.allowance,
                wall_caption(guess.wall.name, {"pool": capacity, "limit": limit, "budget": guard.budget,
                                               "floor": guard.floor}[guess.wall.name]), guess.share),
        width="stretch",
    )
    {"ok": st.success, "tight": st.warning, "over": st.error}[guess.level](guess.message)
    notes = []
    if limit:
        notes.append("A memory limit counts the worker's own memory (its first sample in the last load) as well.")
    if guard.floor is not None and not typed_size("memory_floor"):
        notes.append(f"The guard's configured floor ({fmt.gib(guard.floor)} of MemAvailable) applies.")
    if dtype != DTYPES[0]:
        notes.append("The forecast uses the checkpoint's bytes; a dtype change scales what is placed.")
    if kind == "generate":
        notes.append("For a generate job this bar counts the weights only; the submit check below uses the whole"
                     " forecast (activations, decoded frames, the process).")
    if notes:
        st.caption(" ".join(notes))


@st.cache_data(ttl=10, show_spinner="Forecasting…")
def admission(spec_json: str, db: str) -> dict | None:
    """jobs.admission.assess of a spec (as JSON, so it caches): the forecast, its refusal and seconds."""
    found = assess(JobSpec.from_dict(json.loads(spec_json)), data.config(), connect(db))
    return None if found is None else found.to_dict()


def forecast_panel(raw: dict[str, Any], choice: CheckpointChoice | None, db: str) -> None:
    """The submit check before Queue is pressed: the refusal in red with its numbers, a checkbox to queue
    anyway, and a generate's predicted seconds per stage."""
    if choice is None or not choice.ok:
        return
    try:
        spec = build_spec({**raw, "forced": False}, data.config())
    except JobSpecError:
        return  # the queue button names the bad fields
    found = admission(json.dumps(spec.to_dict()), db)
    if found is None:
        return
    if found["refusal"]:
        st.error(found["refusal"] + ". The job would be refused at submit.", icon=":material/block:")
        st.checkbox("Queue anyway (forced)", key=key("forced"),
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
            st.session_state[ERRORS_KEY] = {"forecast": [str(e)]}
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
    st.subheader("Ready?")
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


@st.fragment(run_every=frame.LIVE_EVERY)
def queue_panel(db: str) -> None:
    """Running and queued jobs with Cancel: the same list, refreshed as often, as the header's chip."""
    st.subheader("Queue")
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
    st.title("Run a job")
    fill_from_query(db)
    filled = st.session_state.get(FROM_KEY)
    if filled is not None:
        st.info(f"Filled from job {filled}: change what you like and queue it as a new job.", icon=":material/edit:")
    form, side = st.columns([3, 2], gap="large")
    with form:
        choice = checkpoint_field(data.checkpoints(tuple(str(r) for r in config.model_roots)), config.model_roots)
        component = component_field(choice)
        kind, mode = job_fields()
        device, dtype = device_fields(data.devices())
        slow = mode_warning(mode, device)
        if slow:
            text = slow.removeprefix("warning: ")
            st.warning(text[:1].upper() + text[1:], icon=":material/speed:")
        raw: dict[str, Any] = {
            "kind": kind, "model": str(choice.path) if choice else "", "component": component, "mode": mode,
            "device": device.spec, "dtype": None if dtype == DTYPES[0] else dtype, **limit_fields(device, kind, mode),
        }
        if kind == "generate":
            raw["generate"] = generate_fields(choice)
        raw["offload"] = offload_fields(device)
        keep(_drawn)
    mirror_in_url()
    with side:
        with st.container():  # a fixed slot: the button below keeps its place whatever the forecast draws
            fit_panel(choice, kind, component, mode, device, dtype, db)
            forecast_panel(raw, choice, db)
        queue_button(raw, choice, db)
        ready_panel(choice, device, db)
        queue_panel(db)


main()
