"""Job specs and their validation, done in the submitting process before anything is queued.

`build_spec(raw, config)` turns user input (CLI flags, dashboard form, a stored
spec being retried) into a `JobSpec` or raises `JobSpecError` naming every bad
field; a stored spec is read back with `JobSpec.from_dict`.
"""

from __future__ import annotations

import re
from pathlib import Path
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable, Mapping

from loader.checkpoint import checked_checkpoint
from machine.device import DeviceInfo, parse_device_spec, probe_device
from loader.dtypes import parse_dtype
from core.echo import echo
from core.errors import CheckpointError, DeviceError, DrainboardError, PlacementError
from machine.offload import OffloadSettings
from loader.placement import known_placements
from loader.checkpoint import checkpoint_problems
from core.sizes import parse_size
from models.params import INDEX_FILE, GenerateParams, GenerateParamsError, ModelSpec, validate_params
from jobs.errors import JobSpecError
from storage.config import Config, ModelPathError, resolve_model_path

MIN_MEMORY_SIZE = 2**20
"""The smallest memory limit, budget or floor accepted (1 MiB): below it a job cannot even start Python."""

CHECKPOINT_KINDS = ("load", "generate")
"""Kinds whose checkpoint the loader reads: refused at submit when the loader would refuse it (a plugin
kind may use its model path otherwise)."""

__all__ = ["JobSpec", "JobSpecError", "MIN_MEMORY_SIZE", "build_spec", "parse_size"]


@dataclass(frozen=True)
class JobSpec:
    """One job as queued. Stored as JSON in `jobs.spec`; `to_dict`/`from_dict` round-trip it."""

    kind: str
    """Registered job kind (`load`, `generate`, or a plugin's)."""
    model: str
    """Resolved checkpoint path (file or folder), under a configured model root."""
    component: str | None = None
    """Component folder of a diffusers layout (`transformer`, `vae`, ...); None for the folder itself."""
    mode: str = "stream"
    """Placement mode: stream, drain or retain."""
    device: str = "cpu"
    """Target device spec: cpu, cuda, cuda:N or mps."""
    dtype: str | None = None
    """Target dtype (float32, bfloat16, float16); None keeps the checkpoint's."""
    offload: OffloadSettings = field(default_factory=OffloadSettings)
    """Offload flags as requested; the job resolves them against the probed device."""
    sample_every: int = 1
    """Record a memory sample every N placed tensors."""
    memory_limit: int | None = None
    """Memory cgroup limit for the job's process, in bytes; None for no limit."""
    gpus: int = 1
    """Number of GPUs (ranks) the job uses."""
    memory_budget: int | None = None
    """The memory guard's budget: most bytes the job may add to system in use (MemTotal - MemAvailable)
    over its start, CUDA allocations on unified memory included; None for no budget."""
    memory_floor: int | None = None
    """The memory guard's floor: least MemAvailable in bytes; None for the configured floor."""
    drop_page_cache: bool | None = None
    """Drop each shard's pages from the page cache once placed; None leaves it to the policy's default."""
    sequential_components: bool | None = None
    """Generate: load, run and free one component at a time; None leaves it to the policy's default."""
    generate: GenerateParams | None = None
    """Generate parameters; set exactly when kind is `generate`."""
    skeleton: bool = False
    """Load: build the module from the checkpoint's own names and shapes, not its config's registered class
    (a checkpoint of another layout); False checks names and shapes strictly, as generate does."""
    offload_set: tuple[str, ...] = ()
    """The offload flags the user set; the fit-aware policy decides the others (`machine.offload`)."""
    forced: bool = False
    """Queued with `--force` (or the Run page's "Queue anyway"): a refusal of the forecast was overridden."""
    forecast: dict[str, Any] | None = None
    """What `jobs.admission` predicted at submit: per stage bytes, work and seconds, and any refusal."""
    plan: str | None = None
    """Generate: `fastest` picks residency, weight precision and speed levers at submit (`models.plan`)."""
    plan_lossy: bool = False
    """Generate with `plan`: lossy levers (quantized weights, fp8 compute, SageAttention, a step cache) may be picked."""
    planned: dict[str, Any] | None = None
    """What the plan considered, chose and why (`models.plan.Plan.to_dict`), set at submit."""
    model_roots: tuple[str, ...] = ()
    """The model roots the paths were checked against at submit (the configuration's, never the user's):
    a worker reading other roots refuses the job in words (`roots_mismatch`) instead of failing it deep in
    a load. Empty in specs stored before it was recorded."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobSpec":
        """Rebuild a stored spec (already validated when it was queued)."""
        values = dict(data)
        values["offload"] = OffloadSettings.from_dict(values.get("offload", {}))
        if values.get("generate") is not None:
            values["generate"] = GenerateParams(**values["generate"])
        values["offload_set"] = tuple(values.get("offload_set", ()))
        values["model_roots"] = tuple(values.get("model_roots", ()))
        return cls(**values)

    def roots_mismatch(self, roots: list) -> str | None:
        """Why this spec cannot run under `roots` (a worker's configured model roots): None when they are the
        ones it was checked against at submit (in any order), or when it recorded none."""
        mine, theirs = sorted(self.model_roots), sorted(str(r) for r in roots)
        if not mine or mine == theirs:
            return None
        return (f"this job was checked against the model roots {', '.join(mine)} when it was submitted, but this "
                f"worker reads {', '.join(theirs) or '(none)'}; start the worker with the same model roots "
                f"(DRAINBOARD_MODEL_ROOTS or model_roots in drainboard.toml, and the same hub_cache setting) "
                f"or submit the job again to this worker's roots")


class _Problems:
    """Every problem found in one spec, in the order the fields are checked."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str]] = []

    def add(self, name: str, message: str) -> None:
        self.found.append((name, message))

    def raise_any(self) -> None:
        if self.found:
            name, message = self.found[0]
            raise JobSpecError(name, message, [f"{n}: {m}" for n, m in self.found])


Probe = Callable[[str], DeviceInfo]


def build_spec(raw: Mapping[str, Any], config: Config, *, known_kinds: tuple[str, ...] | None = None,
               probe: Probe = probe_device) -> JobSpec:
    """Validate user input and return the spec to queue, or raise `JobSpecError` listing every bad field.

    `raw` has JobSpec's field names; `generate` and `offload` are mappings;
    sizes may be size strings (`core.sizes`). The model path must exist under
    one of `config.model_roots`. `known_kinds` defaults to the registered kinds;
    `probe` (loader's device probe, which creates no CUDA context) checks that a
    CUDA device asked for is there.
    """
    from jobs.kinds import kind_names

    problems = _Problems()
    _check_field_names(raw, problems)
    kind = _kind(raw.get("kind"), known_kinds if known_kinds is not None else kind_names(), problems)
    model = _model(raw.get("model"), config, problems)
    device = _device(raw.get("device", "cpu"), problems)
    gpus = _int_at_least(raw.get("gpus", 1), 1, "gpus", problems)
    values: dict[str, Any] = {
        "kind": kind,
        "model": model,
        "component": _component(raw.get("component") or None, model, config, problems),
        "mode": _choice(raw.get("mode", "stream"), known_placements(), "mode", "placement mode", problems),
        "device": device,
        "dtype": _dtype(raw.get("dtype") or None, problems),
        "offload": _offload(raw.get("offload") or {}, problems),
        "sample_every": _int_at_least(raw.get("sample_every", 1), 1, "sample_every", problems),
        "gpus": gpus,
        **_memory_sizes(raw, problems),
        "drop_page_cache": _optional_bool(raw.get("drop_page_cache"), "drop_page_cache", problems),
        "sequential_components": _optional_bool(raw.get("sequential_components"), "sequential_components", problems),
        "generate": _generate(kind, raw.get("generate"), model, config, problems),
        "offload_set": tuple(sorted(raw.get("offload") or {})),
        "forced": bool(_optional_bool(raw.get("forced"), "forced", problems)),
        "model_roots": tuple(str(r) for r in config.model_roots),
        "plan": _plan(raw.get("plan"), kind, problems),
        "plan_lossy": bool(_optional_bool(raw.get("plan_lossy"), "plan_lossy", problems)),
    }
    if device is not None and gpus is not None:
        if gpus > 1 and not device.startswith("cuda"):
            problems.add("gpus", f"{gpus} GPUs need a cuda device, got {device!r}")
        else:
            _check_device_present(device, gpus, probe, problems)
    _check_levers(values, problems)
    if values["sequential_components"] is not None and kind != "generate":
        problems.add("sequential_components", f"only applies to generate jobs, not {kind!r}")
    _check_drop_page_cache(values, problems)
    values["skeleton"] = _skeleton(raw.get("skeleton", False), values, problems)
    if kind in CHECKPOINT_KINDS:
        _check_checkpoint(model, config, problems, kind)
    problems.raise_any()
    return JobSpec(**values)


def _plan(value: Any, kind: Any, problems: _Problems) -> str | None:
    """`plan`: unset, or one of `models.plan.PLANS` for a generate job."""
    from models.request_args import PLANS

    if value is None:
        return None
    if value not in PLANS:
        problems.add("plan", f"unknown plan {echo(value)}; known: {', '.join(PLANS)}")
    elif kind != "generate":
        problems.add("plan", f"only generate jobs take a plan, not {kind!r}")
    return value


def _skeleton(value: Any, values: Mapping[str, Any], problems: _Problems) -> bool:
    """The load-only `skeleton` switch: a boolean, for a one-rank load."""
    if type(value) is not bool:
        problems.add("skeleton", f"must be true or false, got {value!r}")
        return False
    if value and values["kind"] != "load":
        problems.add("skeleton", f"only load jobs build a skeleton, not {values['kind']!r}")
    elif value and values["gpus"] is not None and values["gpus"] > 1:
        problems.add("skeleton", f"sharded loads ({values['gpus']} GPUs) do not take it")
    return value


def _check_levers(values: Mapping[str, Any], problems: _Problems) -> None:
    """A lever the job's device cannot run (a CUDA-only attention backend on a CPU, fp8 compute or an fp8 / int8
    DiT without torchao or below its compute capability, more ranks than GPUs) is refused here, as the Run page
    warns, not when the child loads the transformer."""
    params = values["generate"]
    if params is None or values["device"] is None:
        return
    if any(name in ("device", "gpus") for name, _ in problems.found):
        return  # the device itself is refused already (its probe failed): that is the line to show
    from models.levers import lever_problems
    from models.quantize_check import cuda_capability

    capability = cuda_capability(*parse_device_spec(values["device"]))
    for name, problem in lever_problems(params.to_dict(), values["device"], capability).items():
        problems.add(f"generate.{name}", problem)
    if isinstance(params.parallel, int) and params.parallel > 1:
        from models.parallel import parallel_problem

        problem = parallel_problem(values["device"], params.parallel) or _split_problem(values["model"], params)
        if problem is not None:
            problems.add("generate.parallel", problem)


def _split_problem(model: str | None, params) -> str | None:
    """Whether the packed sequence divides by the ranks (diffusers' context parallelism splits it evenly); a model
    the forecast cannot read is left to the checkpoint's own checks to name."""
    from models.forecast import packed_rows
    from models.params import split_problem

    try:
        return None if model is None else split_problem(packed_rows(model, params), params.parallel)
    except (DrainboardError, OSError, ValueError, KeyError):
        return None


def _check_checkpoint(model: str | None, config: Config, problems: _Problems, kind: str) -> None:
    """The loader's own check of the checkpoint, the one the Run page shows (`checkpoint_problems`):
    a checkpoint the page refuses, a truncated shard say, is refused here too, before it is queued; a generate's
    checkpoint must also be an H3 model folder whose DiT is not packed (`models.formats`), never a skeleton."""
    if model is None:
        return
    index, found = checkpoint_problems(model, config.model_roots)
    if found:
        problems.add("model", "; ".join(found))
    elif kind == "generate" and index is not None:
        from models.single_file import generate_checkpoint_problem

        problem = generate_checkpoint_problem(index)
        if problem is not None and not any(name == "model" for name, _ in problems.found):
            problems.add("model", problem)


def _check_drop_page_cache(values: Mapping[str, Any], problems: _Problems) -> None:
    """Only a one-rank `stream` load drops pages it read (the loader's `drop_page_cache`): anywhere else the
    switch would change nothing, so it is refused rather than ignored."""
    if values["drop_page_cache"] is None:
        return
    if values["kind"] != "load":
        problems.add("drop_page_cache", f"only load jobs apply it, not {values['kind']!r}")
    elif values["mode"] != "stream":
        problems.add("drop_page_cache", f"only the stream mode drops the page cache, not {values['mode']!r}")
    elif values["gpus"] is not None and values["gpus"] > 1:
        problems.add("drop_page_cache", f"sharded loads ({values['gpus']} GPUs) do not apply it")


def _check_field_names(raw: Mapping[str, Any], problems: _Problems) -> None:
    spec_fields = {f.name for f in fields(JobSpec)}
    for name in sorted(set(raw) - spec_fields):
        problems.add(name, f"unknown field; known: {', '.join(sorted(spec_fields))}")


def _kind(kind: Any, kinds: tuple[str, ...], problems: _Problems) -> Any:
    if kind not in kinds:
        problems.add("kind", f"unknown job kind {echo(kind)}; known: {', '.join(kinds)}")
    return kind


def _choice(value: Any, known: list[str] | tuple[str, ...], name: str, what: str, problems: _Problems) -> Any:
    if value not in known:
        problems.add(name, f"unknown {what} {echo(value)}; known: {', '.join(known)}")
    return value


def _model(model: Any, config: Config, problems: _Problems) -> str | None:
    """The resolved checkpoint path, refused unless it lies under a model root."""
    if not model:
        problems.add("model", "a checkpoint path is required")
        return None
    try:
        return str(resolve_model_path(model, config.model_roots))
    except ModelPathError as e:
        problems.add("model", str(e))
        return None


def _component(component: Any, model: str | None, config: Config, problems: _Problems) -> str | None:
    """A folder name the checkpoint's discovery knows; a checkpoint that cannot be read is left to the job to report."""
    if component is None:
        return None
    if not isinstance(component, str) or not re.fullmatch(r"[\w.-]+", component) or component in (".", ".."):
        problems.add("component", f"must be a folder name such as transformer, got {echo(component)}")
        return component
    if model is not None:
        index, _ = checked_checkpoint(model, config.model_roots)
        if index is None:
            return component  # the job fails naming the file; a wrong component would be one more guess
        try:
            index.component(component)
        except CheckpointError as e:
            problems.add("component", str(e))
    return component


def _device(device: Any, problems: _Problems) -> str | None:
    try:
        parse_device_spec(device)
    except DeviceError as e:
        problems.add("device", str(e))
        return None
    return device.strip()


def _check_device_present(device: str, gpus: int, probe: Probe, problems: _Problems) -> None:
    """Refuse a device this machine lacks now, not in the child: torch's build first, then the CUDA driver
    (for every ordinal `gpus` ranks use; the probe asks the driver and creates no context)."""
    import torch

    kind, index = parse_device_spec(device)
    if kind == "mps" and not torch.backends.mps.is_available():
        problems.add("device", f"{device!r} is not available here: torch reports no MPS device")
    if kind != "cuda":
        return
    if not torch.backends.cuda.is_built():
        problems.add("device", f"{device!r} is not available here: this torch ({torch.__version__}) is built without CUDA")
        return
    for ordinal in range(index, index + gpus):
        info = probe(f"cuda:{ordinal}")
        if info.source == "probe-failed":
            name = "device" if ordinal == index else "gpus"
            reason = info.reason.partition("; treating")[0]  # the probe's fallback note does not apply to a refusal
            problems.add(name, f"cuda:{ordinal} is not available here: {reason}")
            return


def _dtype(dtype: Any, problems: _Problems) -> str | None:
    if dtype is None:
        return None
    try:
        return str(parse_dtype(str(dtype))).removeprefix("torch.")
    except PlacementError as e:
        problems.add("dtype", str(e))
        return None


def _offload(flags: Mapping[str, Any], problems: _Problems) -> OffloadSettings:
    names = {f.name for f in fields(OffloadSettings)}
    unknown = sorted(set(flags) - names)
    if unknown:
        problems.add("offload", f"unknown flags {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    elif any(not isinstance(v, bool) for v in flags.values()):
        problems.add("offload", "every flag must be true or false")
    else:
        return OffloadSettings(**flags)
    return OffloadSettings()


def _memory_sizes(raw: Mapping[str, Any], problems: _Problems) -> dict[str, int | None]:
    """`memory_limit` (checked to be applicable here), `memory_budget` and `memory_floor`.

    A budget above the limit is allowed: the budget counts system in use, CUDA allocations on unified
    memory included, which a memory cgroup does not see.
    """
    from jobs.cgroups import memory_limit_support

    sizes: dict[str, int | None] = {}
    for name in ("memory_limit", "memory_budget", "memory_floor"):
        sizes[name] = None
        if raw.get(name) in (None, ""):
            continue
        try:
            sizes[name] = parse_size(raw[name], minimum=MIN_MEMORY_SIZE)
        except ValueError as e:
            problems.add(name, str(e))
    if sizes["memory_limit"] is not None:
        reason = memory_limit_support()
        if reason is not None:
            problems.add("memory_limit", f"per-job memory limits are not available here: {reason}")
    return sizes


def _optional_bool(value: Any, name: str, problems: _Problems) -> bool | None:
    if value is not None and not isinstance(value, bool):
        problems.add(name, f"must be true, false or unset (the policy default), got {echo(value)}")
        return None
    return value


def _generate(kind: Any, raw: Any, model: str | None, config: Config, problems: _Problems) -> GenerateParams | None:
    """Generate parameters: types here, ranges by the model's own rules (set exactly for generate jobs); a
    single-file DiT (`transformer`) resolved under the model roots, as the model is."""
    if kind != "generate":
        if raw:
            problems.add("generate", f"generate parameters only apply to generate jobs, not {kind!r}")
        return None
    params = _generate_params(raw or {}, problems)
    if params is not None and params.transformer is not None:
        try:
            params = replace(params, transformer=str(resolve_model_path(params.transformer, config.model_roots)))
        except ModelPathError as e:
            problems.add("generate.transformer", str(e))
            return None
    if params is not None and model is not None:
        _check_against_model(params, model, problems)
        params = _checked_loras(params, model, config, problems)
    return params


def _checked_loras(params: GenerateParams, model: str, config: Config, problems: _Problems) -> GenerateParams:
    """Each LoRA resolved under a model root and checked against the model (`models.lora_inputs.inspect_lora`),
    recorded with its content hash and partition; a bad one is refused naming the file."""
    if not params.loras:
        return params
    from models.lora_inputs import LoraError, inspect_lora

    checked = []
    for i, lora in enumerate(params.loras):
        try:
            resolve_model_path(lora.file, config.model_roots)
            checked.append(inspect_lora(lora, model, params.resolved_workflow, config.model_roots).lora)
        except ModelPathError as e:
            problems.add(f"generate.loras[{i}]", f"LoRA {echo(lora.file)}: {e}")
        except LoraError as e:
            problems.add(f"generate.loras[{i}]", str(e))
    return replace(params, loras=tuple(checked)) if len(checked) == len(params.loras) else params


def _int_at_least(value: Any, minimum: int, name: str, problems: _Problems) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value))
        except ValueError:
            problems.add(name, f"must be an integer, got {echo(value)}")
            return None
    if value < minimum:
        problems.add(name, f"must be at least {minimum}, got {value}")
        return None
    return value


def _generate_params(raw: Mapping[str, Any], problems: _Problems) -> GenerateParams | None:
    """Types only (names, ints, a float, a bool, strings): the ranges are the model's to judge."""
    names = {f.name for f in fields(GenerateParams)}
    for name in sorted(set(raw) - names):
        problems.add(f"generate.{name}", f"unknown parameter; known: {', '.join(sorted(names))}")
    unset = {f.name for f in fields(GenerateParams) if f.default is None}  # a stored spec says None for these
    values = {k: v for k, v in raw.items() if k in names and not (v is None and k in unset)}
    ok = True
    if "loras" in values:
        try:
            values["loras"] = GenerateParams(prompt="", loras=values["loras"]).loras
        except GenerateParamsError as e:
            problems.add("generate.loras", e.problems["loras"])
            ok = False
    for name in ("prompt", "negative_prompt", "transformer", "qkv_layout"):
        if name in values:
            problem = _text_problem(values[name])
            if problem is not None:
                problems.add(f"generate.{name}", problem)
                ok = False
    if "prompt" not in values:
        problems.add("generate.prompt", "a prompt is required")
        ok = False
    for name in ("frames", "height", "width", "steps", "seed", "fps", "parallel"):
        if name in values:
            value = values[name]
            try:
                if isinstance(value, bool) or isinstance(value, float):
                    raise ValueError
                values[name] = int(str(value))
            except ValueError:
                problems.add(f"generate.{name}", f"must be an integer, got {echo(value)}")
                ok = False
    if "guidance_scale" in values:
        try:
            if isinstance(values["guidance_scale"], bool):
                raise ValueError
            values["guidance_scale"] = float(values["guidance_scale"])
        except (TypeError, ValueError):
            problems.add("generate.guidance_scale", f"must be a number, got {echo(values['guidance_scale'])}")
            ok = False
    for name in ("audio", "compile"):
        if name in values and not isinstance(values[name], bool):
            problems.add(f"generate.{name}", f"must be true or false, got {echo(values[name])}")
            ok = False
    return GenerateParams(**values) if ok else None


def _check_against_model(params: GenerateParams, model: str, problems: _Problems) -> None:
    """The models package's own validation (config.json and index headers only, no weights),
    each problem filed under `generate.<field>`, or under `model` when the folder is no generate model. A
    lone file or a folder without the pipeline's index is left to `_check_checkpoint`, which names what it is."""
    if not (Path(model) / INDEX_FILE).is_file():
        return
    try:
        validate_params(params, ModelSpec.read(model))
    except GenerateParamsError as e:
        for name, message in sorted(e.problems.items()):
            problems.add("model" if name == "model" else f"generate.{name}", message)


def _text_problem(value: Any) -> str | None:
    """Why `value` is not storable text: not a string, or not valid UTF-8 (a command line's stray byte
    arrives as a lone surrogate, U+DC80..U+DCFF, which neither SQLite nor the tokenizer can encode)."""
    if not isinstance(value, str):
        return f"must be text, got {echo(value)}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        char = ord(value[e.start])
        what = f"byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else f"character U+{char:04X}"
        return f"is not valid UTF-8 text: {what} at position {e.start}"
    return None
