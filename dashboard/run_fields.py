"""The Run form's fields, one function per group: each draws its widgets (seeded from the form's memory, with
the last submit's messages under them) and returns the spec's raw fields for jobs.spec.build_spec."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import data
from dashboard import format as fmt
from dashboard import words
from dashboard.form_state import durable, keep, keep_selection, key, seed, show_errors
from dashboard.inputs_panel import workflow_section
from dashboard.views.checkpoints import CheckpointChoice, components_table, outside_roots
from dashboard.views.run import (
    DEFAULT_COMPONENT, DTYPES, GENERATE_FIELDS, KIND_LABELS, MODE_HELP, OFFERED_FLAGS, POLICY_DEFAULT, TRISTATE,
    generate_defaults, generate_geometry, offload_preview, offload_summary,
)
from jobs.kinds import kind_names
from loader.device import DeviceInfo
from loader.offload import OffloadSettings

DEFAULT_PROMPT = "a red fox trotting through fresh snow at dawn, soft light"
MODES = ("stream", "drain", "retain")


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
