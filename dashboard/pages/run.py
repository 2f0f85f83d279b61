"""Run: choose a checkpoint and settings, see whether it will fit and what the offload policy
will do, queue the job. Validation is jobs.spec.build_spec's; nothing is queued on error."""

import shutil
from dataclasses import fields

import streamlit as st

from dashboard import charts, data, nav
from dashboard import format as fmt
from dashboard.host import read_host_memory
from dashboard.views.jobs import describe_supervisor
from dashboard.views.run import MODE_HELP, components_table, forecast, offload_preview
from dashboard.views.spec import field_errors, job_label
from jobs.kinds import kind_names
from jobs.queue import JobStateError, cancel, enqueue
from jobs.spec import GenerateParams, JobSpecError, build_spec
from loader.offload import OffloadSettings
from storage.connections import connect

ERRORS_KEY = "run_errors"  # session key: field -> messages from the last rejected submit
DEFAULT_PROMPT = "a red fox trotting through fresh snow at dawn, soft light"
KIND_LABELS = {"load": "load", "generate": "load + generate"}
DTYPES = ["checkpoint dtype", "bfloat16", "float16", "float32"]

config = data.config()
db = data.db_path()
errors: dict[str, list[str]] = st.session_state.get(ERRORS_KEY, {})


def show_errors(*names: str) -> None:
    """Messages for these fields from the last rejected submit, right under the widget."""
    for name in names:
        for message in errors.get(name, []):
            st.error(message, icon=":material/error:")


st.title("Run a job")
form, side = st.columns([3, 2], gap="large")

with form:
    choices = data.checkpoints(tuple(str(r) for r in config.model_roots))
    usable = [c for c in choices if not c.problem]
    if not usable:
        st.warning(
            "No checkpoint found under the model roots: "
            + ", ".join(str(r) for r in config.model_roots)
            + ". Write one with `python -m models synth DIR --profile demo` or set DRAINBOARD_MODEL_ROOTS."
        )
    default_index = next((i for i, c in enumerate(usable) if c.path.name == "demo"), 0)
    choice = st.selectbox(
        "Checkpoint", usable, index=default_index if usable else None, format_func=lambda c: c.label, key="run_checkpoint"
    )
    show_errors("model")
    component = None
    if choice is not None:
        with st.expander(f"Components of {choice.path.name} ({fmt.gib(choice.total_bytes)})", expanded=False):
            st.dataframe(components_table(choice), hide_index=True, width="stretch")
        if len(choice.components) > 1:
            names = [c.name for c in choice.components]
            picked = st.selectbox(
                "Component to load",
                ["(default: transformer)"] + names,
                key="run_component",
                help="A load job loads one component; a generate job loads every component.",
            )
            component = None if picked.startswith("(") else picked
    show_errors("component")

    kinds = [k for k in ("load", "generate") if k in kind_names()] + [k for k in kind_names() if k not in ("load", "generate")]
    kind = st.segmented_control("Job", kinds, default="load", format_func=lambda k: KIND_LABELS.get(k, k), key="run_kind") or "load"
    show_errors("kind")
    mode = st.segmented_control("Placement mode", ["stream", "drain", "retain"], default="stream", key="run_mode") or "stream"
    st.caption(MODE_HELP[mode])
    show_errors("mode")

    device_list = data.devices()
    left, right = st.columns(2)
    device = left.selectbox(
        "Device",
        device_list,
        format_func=lambda d: f"{d.spec} — {d.name}" + (" (unified memory)" if d.unified_memory and d.kind != "cpu" else ""),
        key="run_device",
    )
    show_errors("device")
    dtype = right.selectbox("dtype", DTYPES, key="run_dtype", help="Target dtype; the checkpoint's own keeps bytes unchanged.")
    show_errors("dtype")

    left, right = st.columns(2)
    sample_every = left.number_input(
        "Sample memory every N tensors", min_value=1, value=1, step=1, key="run_sample_every",
        help="1 records a sample per placed tensor (the default); generate stages also sample on a timer.",
    )
    show_errors("sample_every")
    limit_reason = data.memory_limit_reason()
    memory_limit = right.text_input(
        "Memory limit (cgroup)",
        value="",
        placeholder="e.g. 8GiB" if limit_reason is None else "not available here",
        disabled=limit_reason is not None,
        help=limit_reason or "Kill the job's process tree when it uses more than this.",
        key="run_memory_limit",
    )
    show_errors("memory_limit")
    gpus = 1
    if device.kind == "cuda":
        gpus = st.number_input("GPUs (ranks)", min_value=1, value=1, step=1, key="run_gpus")
        show_errors("gpus")

    generate = None
    if kind == "generate":
        st.subheader("Generate")
        base = GenerateParams(prompt=DEFAULT_PROMPT)
        prompt = st.text_area("Prompt", value=base.prompt, key="run_prompt", height=80)
        show_errors("generate.prompt")
        cols = st.columns(4)
        frames = cols[0].number_input("Frames", min_value=1, value=base.frames, key="run_frames")
        height = cols[1].number_input("Height", min_value=16, value=base.height, step=16, key="run_height")
        width = cols[2].number_input("Width", min_value=16, value=base.width, step=16, key="run_width")
        steps = cols[3].number_input("Steps", min_value=1, value=base.steps, key="run_steps")
        cols = st.columns(4)
        seed = cols[0].number_input("Seed", min_value=0, value=base.seed, key="run_seed")
        guidance = cols[1].number_input("Guidance", min_value=0.0, value=base.guidance_scale, step=0.5, key="run_guidance")
        fps = cols[2].number_input("FPS", min_value=1, max_value=120, value=base.fps, key="run_fps")
        audio = cols[3].toggle("Audio track", value=base.audio, key="run_audio")
        show_errors(*[f"generate.{f.name}" for f in fields(GenerateParams) if f.name != "prompt"], "generate")
        generate = {
            "prompt": prompt, "frames": int(frames), "height": int(height), "width": int(width), "steps": int(steps),
            "seed": int(seed), "guidance_scale": float(guidance), "fps": int(fps), "audio": bool(audio),
        }

    with st.expander("Offload settings", expanded=device.kind != "cpu"):
        defaults = OffloadSettings()
        flags = {
            f.name: st.checkbox(f.name, value=getattr(defaults, f.name), key=f"run_offload_{f.name}")
            for f in fields(OffloadSettings)
        }
        show_errors("offload")
    settings = OffloadSettings(**flags)
    st.markdown(f"**What the policy will do on {device.spec}**")
    st.caption(device.reason)
    st.dataframe(
        offload_preview(settings, device),
        hide_index=True,
        width="stretch",
        column_config={"requested": st.column_config.CheckboxColumn(), "used": st.column_config.CheckboxColumn()},
    )

    raw = {
        "kind": kind,
        "model": str(choice.path) if choice else "",
        "component": component,
        "mode": mode,
        "device": device.spec,
        "dtype": None if dtype == DTYPES[0] else dtype,
        "offload": flags,
        "sample_every": int(sample_every),
        "memory_limit": memory_limit.strip() or None,
        "gpus": int(gpus),
    }
    if generate is not None:
        raw["generate"] = generate

    if st.button("Queue job", type="primary", icon=":material/play_arrow:", key="run_submit"):
        try:
            spec = build_spec(raw, config)
        except JobSpecError as e:
            st.session_state[ERRORS_KEY] = field_errors(e.errors)
            st.rerun()
        else:
            st.session_state.pop(ERRORS_KEY, None)
            job_id = enqueue(connect(db, ensure=False), spec)
            data.jobs.clear()
            st.session_state["queued_job"] = job_id
            st.toast(f"Queued job {job_id}")
            nav.goto("job", job=str(job_id))
    if errors:
        st.error("Nothing was queued: " + "; ".join(f"{k}: {m}" for k, ms in errors.items() for m in ms))

with side:
    host = read_host_memory()
    capacity = device.total_memory or host.total
    st.subheader("Will it fit?")
    if choice is not None:
        sizes = {c.name: c.bytes for c in choice.components}
        to_place = sizes.get(component) if component else (
            sum(sizes.values()) if kind == "generate" or len(sizes) == 1 else sizes.get("transformer", sum(sizes.values()))
        )
        guess = forecast(mode, to_place, host.in_use, capacity)
        st.altair_chart(charts.fit_forecast(guess.in_use, guess.predicted_peak, guess.capacity), width="stretch")
        (st.success if guess.share <= 0.8 else st.warning if guess.share <= 1.0 else st.error)(guess.message)
        if dtype != DTYPES[0]:
            st.caption("The forecast uses the checkpoint's bytes; a dtype change scales what is placed.")

    st.subheader("Ready?")
    supervisor = data.supervisor(db)
    disk = shutil.disk_usage(config.data_dir if config.data_dir.exists() else config.data_dir.parent)
    checks = [
        (supervisor["alive"], f"Worker: {describe_supervisor(supervisor)}"),
        (bool(usable), f"Checkpoints found: {len(usable)}" + (f" (selected {fmt.gib(choice.total_bytes)})" if choice else "")),
        (
            device.total_memory is not None,
            f"Capacity {fmt.gib(capacity)} on {device.spec} ("
            + ("host memory, MemTotal" if device.kind == "cpu" else "unified: GPU and CPU share one pool" if device.unified_memory else "device memory")
            + ")",
        ),
        (disk.free > 2 * fmt.GIB, f"Free disk for outputs: {fmt.gib(disk.free)}"),
    ]
    for ok, text in checks:
        st.markdown(f"{':material/check_circle:' if ok else ':material/warning:'} {text}")

    st.subheader("Queue")
    waiting = data.jobs(db, status=("running", "queued"))
    if not waiting:
        st.caption("Nothing running or queued.")
    for job in sorted(waiting, key=lambda j: j["id"]):
        with st.container(border=True):
            top, button = st.columns([4, 1])
            progress = ""
            if job.get("progress_total"):
                progress = f" · {job.get('stage') or ''} {job.get('progress_done') or 0}/{job['progress_total']}"
            top.markdown(f"[{job_label(job)}]({nav.link('job', job=str(job['id']))}) · {job['status']}{progress}")
            if button.button("Cancel", key=f"cancel_{job['id']}"):
                try:
                    cancel(connect(db, ensure=False), job["id"])
                except JobStateError as e:
                    st.warning(str(e))
                data.jobs.clear()
                st.rerun()
