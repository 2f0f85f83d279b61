"""The Run form's fields, one function per group: each draws its widgets (seeded from the form's memory, with
the last submit's messages under them) and returns the spec's raw fields for jobs.spec.build_spec."""

from __future__ import annotations

from pathlib import Path
import json
from typing import Any

import streamlit as st

from core.echo import echo, echo_name
from dashboard import data
from dashboard import format as fmt
from dashboard import words
from dashboard.form_state import (carried_inputs, drop_carried, durable, keep, keep_selection, key, seed,
                                  show_errors)
from dashboard.inputs_panel import stage_plan_section, workflow_section
from dashboard.views.checkpoints import CheckpointChoice, components_table, outside_roots
from dashboard.views.run import FIELD_LABELS as LABEL
from dashboard.views.run import (
    DEFAULT_COMPONENT, GENERATE_FIELDS, OFFERED_FLAGS, POLICY_DEFAULT, QUANTIZE_CHOICES,
    QUANTIZE_NONE, STEP_CACHE_CHOICES, TRISTATE, VAE_DTYPE_CHOICES, dtype_choices, generate_defaults, generate_geometry,
    lora_scale_field, offload_preview, offload_summary, quantize_value,
)
from jobs.kinds import FormField, get_kind, kind_names
from loader.placement import placement_class, placement_classes
from machine.device import DeviceInfo
from machine.offload import OffloadSettings
from models.request.params import MAX_PARALLEL, MAX_SHIFT
from models.request.cli_args import QKV_LAYOUTS
from models.speed.levers import (ATTENTION_BACKENDS, LOSSY_NOTE, LeverOption, is_lossless, lever_option, lever_problems,
                           step_cache_problem)
from models.quantization.check import cuda_capability, quantization_problem, torchao_installed
from models.run.workflows import WORKFLOWS

DEFAULT_PROMPT = "a red fox trotting through fresh snow at dawn, soft light"
KNOBS = ("vae_tiling", "vae_dtype", "quantize", "attention", "compile", "step_cache", "vae_compile")
"""The generate fields knob_fields draws (and shows the messages of)."""


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
    models = [c for c in usable if c.layout == "model"]  # before a folder of LoRAs or a lone file under the root
    default = next((c for c in usable if c.path.name == "demo"), (models or usable or choices)[0])
    wanted = durable().get("checkpoint")
    if wanted and wanted not in by_path:
        st.warning(f"{outside_roots(wanted, roots)} {default.path.name} is chosen instead.")
        durable()["checkpoint"] = str(default.path)
    seed("checkpoint", str(default.path), list(by_path))
    choice = by_path[st.selectbox(LABEL["model"], list(by_path), format_func=lambda p: by_path[p].label, key=key("checkpoint"))]
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
        LABEL["component"], options, key=key("component"),
        format_func=lambda c: f"(default: {choice.default_component})" if c == DEFAULT_COMPONENT else c,
        help="A load job loads one component; a generate job loads every component.",
    )
    show_errors("component")
    return picked or None


def job_fields() -> tuple[str, str]:
    """Job kind and placement mode (neither can be un-selected)."""
    kinds = sorted(kind_names(), key=lambda k: (k != "load", k))  # the page's default first
    seed("kind", "load", kinds)
    modes = [cls.name for cls in placement_classes()]
    seed("mode", "stream", modes)
    keep(["kind", "mode"])  # keep_selection restores these
    kind = st.segmented_control(
        LABEL["kind"], kinds, format_func=lambda k: get_kind(k).label or k, key=key("kind"), on_change=keep_selection, args=("kind",)
    )
    show_errors("kind")
    mode = st.segmented_control(LABEL["mode"], modes, key=key("mode"), on_change=keep_selection, args=("mode",))
    st.caption(placement_class(mode).describe())
    show_errors("mode")
    return kind, mode


def device_fields(devices: list[DeviceInfo]) -> tuple[DeviceInfo, str]:
    by_spec = {d.spec: d for d in devices}
    seed("device", devices[0].spec, list(by_spec))
    dtypes = dtype_choices()
    seed("dtype", dtypes[0], dtypes)
    left, right = st.columns(2)
    spec = left.selectbox(
        LABEL["device"], list(by_spec), key=key("device"),
        format_func=lambda s: f"{s} — {by_spec[s].name}" + (" (unified memory)" if by_spec[s].unified_memory and by_spec[s].kind != "cpu" else ""),
    )
    show_errors("device")
    dtype = right.selectbox(LABEL["dtype"], dtypes, key=key("dtype"), help="Target dtype; the checkpoint's own keeps bytes unchanged.")
    show_errors("dtype")
    return by_spec[spec], dtype


def limit_fields(device: DeviceInfo, kind: str, mode: str) -> dict[str, Any]:
    """Sampling, the memory limit, the GPU count and the guard, as the spec's raw fields."""
    seed("sample_every", 1)
    seed("memory_limit", "")
    seed("gpus", 1)
    left, right = st.columns(2)
    sample_every = left.number_input(
        LABEL["sample_every"], min_value=1, step=1, key=key("sample_every"),
        help="1 records a sample per placed tensor (the default); generate stages also sample on a timer.",
    )
    show_errors("sample_every")
    reason = data.memory_limit_reason()
    memory_limit = right.text_input(
        LABEL["memory_limit"], key=key("memory_limit"), disabled=reason is not None,
        placeholder="e.g. 8GiB" if reason is None else "not available here",
        help=reason or "Kill the job's process tree when it uses more than this (it counts the worker's own memory "
        "too). Empty: no limit. Sizes such as 300MB (powers of 1000) or 8GiB (powers of 1024).",
    )
    show_errors("memory_limit")
    gpus = 1
    if device.kind == "cuda":
        gpus = st.number_input(LABEL["gpus"], min_value=1, step=1, key=key("gpus"))
        show_errors("gpus")
    return {"sample_every": int(sample_every), "memory_limit": memory_limit.strip() or None, "gpus": int(gpus),
            **guard_fields(kind, mode, int(gpus))}


def guard_fields(kind: str, mode: str, gpus: int) -> dict[str, Any]:
    """The memory guard's budget and floor, and (for a one-rank stream load, the only job that applies it)
    whether to drop the page cache, (for a one-rank load) whether to build a skeleton, and (for generate) whether to
    hold one component at a time, as raw spec fields."""
    seed("memory_budget", "")
    seed("memory_floor", "")
    left, right = st.columns(2)
    budget = left.text_input(
        LABEL["memory_budget"], key=key("memory_budget"), placeholder="e.g. 40GiB",
        help="Stop the job when system in use grows more than this over its start. Unlike a cgroup limit it "
             "counts CUDA allocations on unified memory. Empty: no budget.",
    )
    show_errors("memory_budget")
    floor = right.text_input(
        LABEL["memory_floor"], key=key("memory_floor"), placeholder="configured floor",
        help="Stop the job when MemAvailable falls below this; empty keeps the configured floor.",
    )
    show_errors("memory_floor")
    raw: dict[str, Any] = {"memory_budget": budget.strip() or None, "memory_floor": floor.strip() or None}
    if kind == "load" and mode == "stream" and gpus == 1:
        raw["drop_page_cache"] = policy_choice(
            "drop_page_cache", LABEL["drop_page_cache"],
            "Evict the checkpoint's file pages once placed, so cached bytes do not crowd the pool "
            "(the default: on for unified-memory CUDA targets).",
        )
    if kind == "load" and gpus == 1:
        seed("skeleton", False)
        raw["skeleton"] = st.checkbox(
            LABEL["skeleton"], key=key("skeleton"),
            help="Build the module from the checkpoint's own tensor names and shapes instead of the class its "
                 "config names (`--skeleton`): for tensors of another layout. Off, names and shapes are checked "
                 "exactly as a generate job will.")
        show_errors("skeleton")
    if kind == "generate":
        raw["sequential_components"] = policy_choice(
            "sequential_components", LABEL["sequential_components"],
            "Load each component just before its first pipeline block and release it after its last, so the "
            "peak is the largest stage, not the sum (the default: on for unified memory).",
        )
    return raw


SECTIONS = ("load", "generate")
"""The kinds this form draws sections of its own for (`guard_fields`, `generate_fields`, `plan_fields`); any other
kind's options are drawn from its `form_fields`."""


def kind_option_fields(kind: str) -> dict[str, Any]:
    """A kind's own options as it declares them (`JobKind.form_fields`), as raw spec fields: a selectbox of its
    choices, else a checkbox, a whole number or a line of text after the option's default."""
    declared = get_kind(kind)
    if kind in SECTIONS or not declared.form_fields:
        return {}
    if declared.summary:
        st.caption(declared.summary[:1].upper() + declared.summary[1:] + ".")
    defaults = {name: getattr(declared.options(), name) for name in declared.option_names()}
    return {f.name: _option_widget(f, defaults.get(f.name)) for f in declared.form_fields}


def _option_widget(field: FormField, default: Any) -> Any:
    """One declared option's widget, seeded with its default, its messages under it (an empty line of text is an
    option left unset)."""
    textual = not field.choices and not isinstance(default, (bool, int))
    seed(field.name, "" if textual and default is None else default, list(field.choices) or None)
    if field.choices:
        value = st.selectbox(field.label, list(field.choices), key=key(field.name), help=field.help or None)
    elif isinstance(default, bool):
        value = st.checkbox(field.label, key=key(field.name), help=field.help or None)
    elif isinstance(default, int):
        value = st.number_input(field.label, step=1, key=key(field.name), help=field.help or None)
    else:
        value = st.text_input(field.label, key=key(field.name), help=field.help or None) or default
    show_errors(field.name)
    return value


def policy_choice(field: str, label: str, help: str) -> bool | None:
    """A bool spec field the policy decides unless the user says on or off: None, True or False."""
    seed(field, POLICY_DEFAULT, list(TRISTATE))
    choice = st.selectbox(label, list(TRISTATE), key=key(field), help=help)
    show_errors(field)
    return TRISTATE[choice]


def generate_fields(choice, device: DeviceInfo, sequential: bool | None) -> dict[str, Any]:
    """The clip to generate (MiniMax H3 t2va, fl2va or ref2va), its VAE and DiT knobs and its stage plan, as the
    spec's `generate` mapping. `sequential` is the form's one-component-at-a-time choice (None: the policy's)."""
    canvas, multiple = generate_geometry(str(choice.path) if choice else None)
    defaults = generate_defaults(DEFAULT_PROMPT, canvas)
    for name, value in defaults.items():
        seed(name, value, {"gen_quantize": QUANTIZE_CHOICES, "gen_vae_dtype": VAE_DTYPE_CHOICES,
                           "gen_step_cache": STEP_CACHE_CHOICES, "gen_attention": ATTENTION_BACKENDS}.get(name))
    st.subheader("Generate", anchor=False)
    preset_field()
    st.text_area(LABEL["generate.prompt"], key=key("gen_prompt"), height=80)
    show_errors("generate.prompt")
    cols = st.columns(4)
    cols[0].number_input(LABEL["generate.frames"], min_value=124, max_value=345, step=17, key=key("gen_frames"),
                         help="17n + 5: 124 (5.2 s) to 345 (14.4 s)")
    canvas_help = f"a multiple of {multiple}; checkpoint default: {canvas[1]}x{canvas[0]} (width x height)"
    cols[1].number_input(LABEL["generate.height"], min_value=multiple, step=multiple, key=key("gen_height"), help=canvas_help)
    cols[2].number_input(LABEL["generate.width"], min_value=multiple, step=multiple, key=key("gen_width"), help=canvas_help)
    cols[3].number_input(LABEL["generate.steps"], min_value=2, key=key("gen_steps"),
                         help="N steps make N - 1 transformer passes (3 steps = 2 passes); the model's own default is 50")
    cols = st.columns(4)
    cols[0].number_input(LABEL["generate.seed"], min_value=0, key=key("gen_seed"))
    cols[1].toggle(LABEL["generate.audio"], key=key("gen_audio"))
    cols[2].number_input(LABEL["generate.parallel"], min_value=1, max_value=MAX_PARALLEL, step=1,
                         key=key("gen_parallel"),
                         help="Run this one clip on N GPUs of this machine (`--parallel N`): the transformer on each, "
                              "its sequence split by diffusers' context parallelism; the text encoder and VAEs on the "
                              "first. N must divide the transformer's attention heads.")
    cols[3].number_input(LABEL["generate.shift"], min_value=0.01, max_value=MAX_SHIFT, step=0.5,
                         key=key("gen_shift"), placeholder="the checkpoint's",
                         help="The video scheduler's sigma shift (`--shift`); empty: the scheduler config's (12 for "
                              "MiniMax H3). A few-step LoRA's card gives the shift it was distilled for.")
    show_errors(*[f"generate.{name}" for name in GENERATE_FIELDS if name not in ("prompt", *KNOBS)], "generate")
    fields = {name: st.session_state[key(f"gen_{name}")] for name in GENERATE_FIELDS}
    seed("gen_workflow", WORKFLOWS[0], WORKFLOWS)
    fields |= workflow_section(data.config().data_dir, fields["audio"], carried_inputs(), drop_carried)
    show_errors("generate.workflow", "generate.image", "generate.last_image", "generate.ref_image")
    fields |= knob_fields(device)
    fields |= single_file_fields()
    fields |= lever_fields(device, fields["quantize"])
    fields["loras"] = lora_fields(fields["steps"])
    stage_plan_section(fields["workflow"], fields["audio"],
                       device.unified_memory if sequential is None else sequential, fields["quantize"])
    return fields


PRESET_NONE = "none"
"""The Preset select's value for no preset."""


def preset_field() -> None:
    """The Preset select (`models/request/presets.json`): choosing one fills Steps, Shift and its LoRA (found by file name
    under the model roots, at its scale) where the preset states them; the fields stay editable."""
    from models.request.presets import PresetError, read_presets

    try:
        presets = read_presets()
    except PresetError as e:
        st.error(str(e))
        return
    names = (PRESET_NONE, *presets)
    seed("gen_preset", PRESET_NONE, names)
    name = st.selectbox("Preset", names, key=key("gen_preset"), on_change=_apply_preset, args=(presets,),
                        help="A few-step recipe (`--preset`): fills Steps, Shift and its LoRA where it states them.")
    problem = st.session_state.pop(key("gen_preset_problem"), None)
    if problem:
        st.error(problem)
    if name != PRESET_NONE and presets[name].source:
        st.caption(f"Source: {echo(presets[name].source, 400)}")


def _apply_preset(presets: dict) -> None:
    from models.request.presets import PresetError, find_preset_lora

    name = st.session_state[key("gen_preset")]
    if name == PRESET_NONE:
        return
    preset = presets[name]
    for field in ("steps", "shift"):
        if getattr(preset, field) is not None:
            st.session_state[key(f"gen_{field}")] = getattr(preset, field)
    if preset.lora is None:
        return
    try:
        path = str(find_preset_lora(preset, data.config().model_roots))
    except PresetError as e:
        st.session_state[key("gen_preset_problem")] = str(e)
        return
    data.lora_files.clear()  # the list offered is cached; the file just found must be among it
    picked = st.session_state.get(key("gen_loras"), [])
    st.session_state[key("gen_loras")] = [path, *(p for p in picked if p != path)]
    st.session_state[key(lora_scale_field(path))] = preset.scale


def knob_fields(device: DeviceInfo) -> dict[str, Any]:
    """VAE tiling, VAE decode precision and DiT quantization (`--vae-tiling`, `--vae-dtype`, `--quantize`), each
    with what it costs said beside it."""
    from models.run.pipeline import VAE_TILING_WARNING

    cols = st.columns(3)
    tiling = cols[0].toggle(LABEL["generate.vae_tiling"], key=key("gen_vae_tiling"),
                            help="Decode the video on the 256 px tiles H3's VAE was trained on (the default).")
    vae_dtype = cols[1].selectbox(
        LABEL["generate.vae_dtype"], VAE_DTYPE_CHOICES, key=key("gen_vae_dtype"),
        help="bf16 (the default) or the checkpoint's fp32. Measured on one H200 at 1344x768, 124 frames: bf16 "
             "decoded in 15.3 s at an 8.7 GiB peak, fp32 in 57.6 s at 13.4 GiB; bf16's frames were 58.3 dB "
             "(PSNR) from fp32's.")
    quantize = quantize_value(cols[2].selectbox(
        LABEL["generate.quantize"], QUANTIZE_CHOICES, key=key("gen_quantize"),
        format_func=lambda q: "bf16 (not quantized)" if q == QUANTIZE_NONE else lever_option("quantize", q).label,
        help="Quantization of the DiT as it is placed: int8 weights on CPU and CUDA, fp8 weights or fp8 compute "
             "(fp8 activations too: a speed lever) on CUDA compute capability 8.9+. It holds about half the bf16 "
             "bytes."))
    show_errors(*[f"generate.{name}" for name in ("vae_tiling", "vae_dtype", "quantize")])
    if not tiling:
        st.warning(VAE_TILING_WARNING + ". Turn it off only to compare.", icon=":material/warning:")
    if vae_dtype == "fp32":
        st.caption("fp32 decode: about 3.8x the seconds and 1.5x the peak of bf16 (one H200, 1344x768, 124 frames).")
    if quantize is not None:
        problem = quantization_problem(quantize, device.spec, cuda_capability(device.kind, device.index),
                                       torchao_installed())
        if problem:
            st.error(f"{problem}. *Queue job* stays off until this is changed.", icon=":material/error:")
        st.info(f"{quantize} frames are not bit-identical to bf16's: the same seed gives a different clip (the seed "
                "contract holds for unquantized runs only).", icon=":material/info:")
    return {"vae_tiling": bool(tiling), "vae_dtype": vae_dtype, "quantize": quantize}


def single_file_fields() -> dict[str, Any]:
    """`--transformer` and `--qkv-layout`: a single-file DiT in the original layout (Comfy-Org's MiniMax H3 files)
    supplying the transformer's weights, the checkpoint above the rest; nothing when the path is left empty."""
    seed("gen_transformer", "")
    seed("gen_qkv_layout", QKV_LAYOUTS[0], QKV_LAYOUTS)
    cols = st.columns([3, 1])
    path = cols[0].text_input(
        "Single-file transformer (optional)", key=key("gen_transformer"), placeholder="/models/minimax_h3_dit.safetensors",
        help="One .safetensors DiT in the original layout (blocks.N.attn.qkv_proj, mlp.fc1, final_layer), or a "
             ".gguf one kept quantized (needs requirements-gguf.txt): its weights replace the checkpoint's "
             "transformer; the checkpoint supplies the text encoder, VAEs, tokenizer, schedulers and the DiT's "
             "config. It must lie under a model root.")
    layout = cols[1].selectbox(
        "Its qkv rows", QKV_LAYOUTS, key=key("gen_qkv_layout"),
        help="stacked [q; k; v] (every published single file) or interleaved per head (a file merged by hand from "
             "the MiniMaxAI shards); the file cannot tell the two apart.")
    show_errors("generate.transformer", "generate.qkv_layout")
    return {"transformer": path.strip(), "qkv_layout": layout} if path.strip() else {}


def lora_fields(steps: int | None) -> list[dict[str, Any]]:
    """LoRA files found under the model roots, stacked in the order picked, each with its strength (`--lora
    FILE:SCALE`); a few-step file run at many more steps than its metadata states is warned about (Steps unset: the
    job runs at the first picked LoRA's stated steps, as `models.request.params.stated_schedule` fills them, else the
    model's 50)."""
    from models.lora.inputs import MAX_LORAS, MAX_SCALE, few_step_warning
    from models.request.params import DEFAULT_STEPS

    found = {f.path: f for f in data.lora_files(tuple(str(r) for r in data.config().model_roots))}
    seed("gen_loras", [])
    gone = [p for p in st.session_state[key("gen_loras")] if p not in found]
    st.session_state[key("gen_loras")] = [p for p in st.session_state[key("gen_loras")] if p in found]
    picked = st.multiselect(
        "LoRAs", list(found), key=key("gen_loras"), max_selections=MAX_LORAS,
        format_func=lambda p: f"{echo_name(Path(p).name)} ({fmt.gib(found[p].size, 2)})",
        placeholder="none" if found else "no LoRA file under the model roots",
        help="safetensors LoRAs under the model roots, merged into the transformer as it loads, in the order "
             "picked. Checked against the checkpoint when the job is queued.")
    for path in gone:  # an edited job's LoRA moved or deleted since: said, never dropped in silence
        st.warning(f"LoRA {echo_name(path)} is not among the LoRA files under the model roots (moved, deleted or"
                   " no longer a LoRA): it is left out; pick it again once it is back.")
    stated = [found[p].stated_steps for p in picked if found[p].stated_steps is not None]
    runs_at = steps or (stated[0] if stated else DEFAULT_STEPS)  # unset: the first stating LoRA's (stated_schedule)
    loras = []
    for path in picked:
        field = lora_scale_field(path)
        seed(field, 1.0)
        scale = st.number_input(f"Strength of {echo_name(Path(path).name)}", min_value=-MAX_SCALE, max_value=MAX_SCALE,
                                step=0.05, key=key(field))
        warning = few_step_warning(Path(path).name, found[path].stated_steps, runs_at)
        if warning:
            st.warning(warning, icon=":material/speed:")
        loras.append({"file": path, "scale": float(scale)})
    show_errors("generate.loras", *[f"generate.loras[{i}]" for i in range(len(picked))])
    return loras


def lever_fields(device: DeviceInfo, quantize: str | None) -> dict[str, Any]:
    """The speed levers (the DiT's `--attention`, `--compile`, `--step-cache`; the VAE's `--vae-compile`), each named
    lossless or lossy, with what the device cannot run said as `jobs submit` would refuse it."""
    def named(field: str):
        def label(value) -> str:
            option = lever_option(field, value)
            return "native (default)" if option is None else f"{option.label} · {lossless_word(option)}"
        return label

    st.markdown("**Speed levers**")
    cols = st.columns(4)
    attention = cols[0].selectbox(LABEL["generate.attention"], ATTENTION_BACKENDS, key=key("gen_attention"),
                                  format_func=named("attention"),
                                  help="diffusers' attention backend for the DiT: torch SDPA with any kernel (native), "
                                       "or pinned to cuDNN's, flash's or the memory-efficient one; SageAttention "
                                       "where its package is installed.")
    compile = cols[1].toggle(LABEL["generate.compile"], key=key("gen_compile"),
                             help="Compile the DiT's repeated blocks (lossless). The first two calls compile; "
                                  "they are timed as their own stage, denoise.compile.")
    cache = quantize_value(cols[2].selectbox(
        LABEL["generate.step_cache"], STEP_CACHE_CHOICES, key=key("gen_step_cache"),
        format_func=lambda c: "none (every step computed)" if c == QUANTIZE_NONE else named("step_cache")(c),
        help="Reuse DiT work across steps (lossy). Only TaylorSeer applies to MiniMax H3."))
    vae_compile = cols[3].toggle(LABEL["generate.vae_compile"], key=key("gen_vae_compile"),
                                 help="Compile the video VAE decoder's repeated blocks (lossless). Its first call "
                                      "compiles; it is timed as its own stage, decode.compile.")
    show_errors(*[f"generate.{name}" for name in ("attention", "compile", "step_cache", "vae_compile")])
    values = {"attention": attention, "compile": bool(compile), "step_cache": cache, "vae_compile": bool(vae_compile)}
    problems = lever_problems(values, device.spec, cuda_capability(device.kind, device.index))
    problems.pop("quantize", None)  # the quantize control says its own
    cache_problem = step_cache_problem(cache)
    for problem in [*problems.values(), *([cache_problem] if cache_problem else [])]:
        st.error(f"{problem}. *Queue job* stays off until this is changed.", icon=":material/error:")
    if not is_lossless(values | {"quantize": quantize}):
        st.info(LOSSY_NOTE, icon=":material/info:")
    return values


def plan_fields() -> dict[str, Any]:
    """`--plan fastest` and `--allow-lossy`: pick residency, precision and levers at Queue (the Plan table shows
    every candidate)."""
    seed("plan", False)
    seed("plan_lossy", False)
    cols = st.columns(2)
    plan = cols[0].toggle(LABEL["plan"], key=key("plan"),
                          help="At Queue, try resident and sequential residency, the weight precisions and the speed "
                               "levers this device runs, and run the fastest that fits (by this machine's history; "
                               "without it, a stated order of preference). The Plan table shows every candidate.")
    lossy = cols[1].checkbox(LABEL["plan_lossy"], key=key("plan_lossy"), disabled=not plan,
                             help="Let the plan pick quantized weights, fp8 compute, SageAttention or a step cache. "
                                  + LOSSY_NOTE)
    show_errors("plan", "plan_lossy")
    return {"plan": "fastest", "plan_lossy": bool(lossy)} if plan else {}


def lossless_word(option: LeverOption) -> str:
    return "lossless" if option.lossless else "lossy"


def offload_fields(device: DeviceInfo, kind: str) -> tuple[dict[str, bool], Any]:
    """The offload flags the user changed from the defaults, collapsed under a line saying what the job does with
    them (open when the user changed one, so they see what becomes of it), and the slot where `offload_table`
    shows it once the form is read: a generate on a discrete GPU is decided against its own forecast."""
    defaults = OffloadSettings()
    for name in OFFERED_FLAGS:
        seed(f"offload_{name}", getattr(defaults, name))
    flags = {name: bool(st.session_state[key(f"offload_{name}")]) for name in OFFERED_FLAGS}
    touched = any(flags[name] != getattr(defaults, name) for name in OFFERED_FLAGS)
    fit_aware = kind == "generate" and device.kind == "cuda" and not device.unified_memory
    label = (f"Offload on {device.spec}: decided against this job's forecast (components stay on the GPU where "
             "they fit)" if fit_aware else offload_summary(offload_preview(OffloadSettings(**flags), device), device))
    with st.expander(label, expanded=touched):
        cols = st.columns(2)
        for i, name in enumerate(OFFERED_FLAGS):
            cols[i % 2].checkbox(words.flag(name), key=key(f"offload_{name}"), help=name)
        show_errors("offload")
        st.caption(device.reason)
        slot = st.empty()
    # Only the flags the user changed are set: the policy (fit-aware on a discrete GPU) decides the others.
    return {name: value for name, value in flags.items() if value != getattr(defaults, name)}, slot


@st.cache_data(ttl=30, show_spinner=False, hash_funcs={DeviceInfo: lambda d: d.to_dict()})
def decided_offload(spec_json: str, device: DeviceInfo):
    """jobs.probe.job_offload of a spec (as JSON, so it caches): a generate's forecast reads every header."""
    from jobs.probe import job_offload
    from jobs.spec import JobSpec

    return job_offload(JobSpec.from_dict(json.loads(spec_json)), device)


def offload_table(slot, spec, device: DeviceInfo) -> None:
    """What the job will use, flag by flag (jobs.probe.job_offload, as its probe stage decides it), into `slot`;
    the plain policy's answer while the form cannot be built yet."""
    flags = {name: bool(st.session_state[key(f"offload_{name}")]) for name in OFFERED_FLAGS}
    requested = OffloadSettings(**flags)
    decided = decided_offload(json.dumps(spec.to_dict()), device) if spec is not None else None
    slot.dataframe(
        offload_preview(requested, device, decided=decided), hide_index=True, width="stretch",
        column_config={"requested": st.column_config.CheckboxColumn(), "used": st.column_config.CheckboxColumn()},
    )
