"""Job specs and their validation, done in the submitting process before anything is queued.

`build_spec(raw, config)` turns user input (CLI flags, dashboard form, a stored
spec being retried) into a `JobSpec` or raises `JobSpecError` naming every bad
field; a stored spec is read back with `JobSpec.from_dict`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Mapping

from loader.checkpoint import checked_checkpoint
from machine.device import DeviceInfo, parse_device_spec, probe_device
from loader.dtypes import parse_dtype
from core.echo import echo
from core.errors import CheckpointError, DeviceError, PlacementError
from machine.offload import OffloadSettings
from loader.placement import known_placements
from loader.checkpoint import checkpoint_problems
from core.sizes import parse_size
from jobs.errors import JobSpecError, Problems
from jobs.kinds import JobKind, get_kind, kind_names, kinds_with_option
from storage.config import Config, ModelPathError, resolve_model_path

MIN_MEMORY_SIZE = 2**20
"""The smallest memory limit, budget or floor accepted (1 MiB): below it a job cannot even start Python."""

__all__ = ["JobSpec", "JobSpecError", "MIN_MEMORY_SIZE", "build_spec", "parse_size"]


@dataclass(frozen=True)
class JobSpec:
    """One job as queued: the fields every job has, and its kind's own (`options`, the kind's dataclass). Stored
    as JSON in `jobs.spec`, the kind's fields flat beside the others; `to_dict`/`from_dict` round-trip it."""

    kind: str
    """Registered job kind (`load`, `generate`, or a plugin's)."""
    model: str
    """Resolved checkpoint path (file or folder), under a configured model root."""
    component: str | None = None
    """Component folder of a diffusers layout (`transformer`, `vae`, ...); None for the folder itself."""
    mode: str = "stream"
    """Placement mode (`loader.known_placements()`)."""
    device: str = "cpu"
    """Target device spec: cpu, cuda, cuda:N or mps."""
    dtype: str | None = None
    """Target dtype (`core.dtype_names`); None keeps the checkpoint's."""
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
    offload_set: tuple[str, ...] = ()
    """The offload flags the user set; the fit-aware policy decides the others (`machine.offload`)."""
    forced: bool = False
    """Queued with `--force` (or the Run page's "Queue anyway"): a refusal of the forecast was overridden."""
    forecast: dict[str, Any] | None = None
    """What `jobs.admission` predicted at submit: per stage bytes, work and seconds, and any refusal."""
    model_roots: tuple[str, ...] = ()
    """The model roots the paths were checked against at submit (the configuration's, never the user's):
    a worker reading other roots refuses the job in words (`roots_mismatch`) instead of failing it deep in
    a load. Empty in specs stored before it was recorded."""
    options: Any = None
    """The kind's own fields (its `JobKind.options` dataclass: `LoadJobOptions`, `GenerateJobOptions`); its defaults
    when not given."""

    def __post_init__(self) -> None:
        if self.options is None:
            object.__setattr__(self, "options", self.job_kind.options())

    @property
    def job_kind(self) -> type[JobKind]:
        """The registered kind (`KeyError` naming the known ones for a kind no longer registered)."""
        return get_kind(self.kind)

    def to_dict(self) -> dict[str, Any]:
        """The common fields and the kind's own, flat (the stored format)."""
        values = asdict(self)
        return values.pop("options") | values

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobSpec":
        """Rebuild a stored spec (already validated when it was queued). Fields neither common nor the kind's own
        are ignored: a spec stored before kinds had options of their own carried every kind's fields."""
        common = {f.name for f in fields(cls)} - {"options"}
        values = {k: v for k, v in data.items() if k in common}
        values["offload"] = OffloadSettings.from_dict(values.get("offload", {}))
        values["offload_set"] = tuple(values.get("offload_set", ()))
        values["model_roots"] = tuple(values.get("model_roots", ()))
        return cls(**values, options=get_kind(values["kind"]).read(data))

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


Probe = Callable[[str], DeviceInfo]


def build_spec(raw: Mapping[str, Any], config: Config, *, probe: Probe = probe_device) -> JobSpec:
    """Validate user input and return the spec to queue, or raise `JobSpecError` listing every bad field.

    `raw` has JobSpec's field names and the kind's options' (flat); `offload` and the kind's own (a generate's
    `generate`) are mappings; sizes may be size strings (`core.sizes`). The model path must exist under one of
    `config.model_roots`; the kind checks its own options (`JobKind.check`). `probe` (loader's device probe,
    which creates no CUDA context) checks that a CUDA device asked for is there.
    """
    problems = Problems()
    kind = _kind(raw.get("kind"), problems)
    own = _check_field_names(raw, kind, problems)
    model = _model(raw.get("model"), config, problems)
    device = _device(raw.get("device", "cpu"), problems)
    gpus = _int_at_least(raw.get("gpus", 1), 1, "gpus", problems)
    values: dict[str, Any] = {
        "kind": raw.get("kind"),
        "model": model,
        "component": _component(raw.get("component") or None, model, config, problems),
        "mode": _choice(raw.get("mode", "stream"), known_placements(), "mode", "placement mode", problems),
        "device": device,
        "dtype": _dtype(raw.get("dtype") or None, problems),
        "offload": _offload(raw.get("offload") or {}, problems),
        "sample_every": _int_at_least(raw.get("sample_every", 1), 1, "sample_every", problems),
        "gpus": gpus,
        **_memory_sizes(raw, problems),
        "offload_set": tuple(sorted(raw.get("offload") or {})),
        "forced": bool(_optional_bool(raw.get("forced"), "forced", problems)),
        "model_roots": tuple(str(r) for r in config.model_roots),
    }
    if device is not None and gpus is not None:
        if gpus > 1 and not device.startswith("cuda"):
            problems.add("gpus", f"{gpus} GPUs need a cuda device, got {device!r}")
        else:
            _check_device_present(device, gpus, probe, problems)
    if kind is not None and kind.reads_checkpoint:
        _check_checkpoint(model, config, problems)
    if kind is not None:
        values["options"] = kind.check({k: raw[k] for k in own}, values, config, problems)
    problems.raise_any()
    return JobSpec(**values)


def _check_checkpoint(model: str | None, config: Config, problems: Problems) -> None:
    """The loader's own check of the checkpoint, the one the Run page shows (`checkpoint_problems`):
    a checkpoint the page refuses, a truncated shard say, is refused here too, before it is queued."""
    if model is None:
        return
    _, found = checkpoint_problems(model, config.model_roots)
    if found:
        problems.add("model", "; ".join(found))


def _check_field_names(raw: Mapping[str, Any], kind: type[JobKind] | None, problems: Problems) -> list[str]:
    """The kind's own fields in `raw`; another kind's field, set, is refused naming the kinds that take it (unset
    or at its default it is ignored: a stored spec may carry every kind's), any other unknown name listing the
    known ones."""
    common = {f.name for f in fields(JobSpec)} - {"options"}
    own = set(kind.option_names()) if kind is not None else set()
    for name in sorted(set(raw) - common - own):
        others = kinds_with_option(name)
        if raw[name] is None or any(raw[name] == default for default in others.values()):
            continue
        if others:
            problems.add(name, f"only {' and '.join(others)} jobs take it, not {echo(raw.get('kind'))}")
        elif kind is not None:
            problems.add(name, f"unknown field; known: {', '.join(sorted(common | own))}")
    return sorted(own & set(raw))


def _kind(name: Any, problems: Problems) -> type[JobKind] | None:
    """The registered kind `name`, or None (filed) for an unknown one."""
    kinds = kind_names()
    if name not in kinds:
        problems.add("kind", f"unknown job kind {echo(name)}; known: {', '.join(kinds)}")
        return None
    return get_kind(name)


def _choice(value: Any, known: list[str] | tuple[str, ...], name: str, what: str, problems: Problems) -> Any:
    if value not in known:
        problems.add(name, f"unknown {what} {echo(value)}; known: {', '.join(known)}")
    return value


def _model(model: Any, config: Config, problems: Problems) -> str | None:
    """The resolved checkpoint path, refused unless it lies under a model root."""
    if not model:
        problems.add("model", "a checkpoint path is required")
        return None
    try:
        return str(resolve_model_path(model, config.model_roots))
    except ModelPathError as e:
        problems.add("model", str(e))
        return None


def _component(component: Any, model: str | None, config: Config, problems: Problems) -> str | None:
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


def _device(device: Any, problems: Problems) -> str | None:
    try:
        parse_device_spec(device)
    except DeviceError as e:
        problems.add("device", str(e))
        return None
    return device.strip()


def _check_device_present(device: str, gpus: int, probe: Probe, problems: Problems) -> None:
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


def _dtype(dtype: Any, problems: Problems) -> str | None:
    if dtype is None:
        return None
    try:
        return str(parse_dtype(str(dtype))).removeprefix("torch.")
    except PlacementError as e:
        problems.add("dtype", str(e))
        return None


def _offload(flags: Mapping[str, Any], problems: Problems) -> OffloadSettings:
    names = {f.name for f in fields(OffloadSettings)}
    unknown = sorted(set(flags) - names)
    if unknown:
        problems.add("offload", f"unknown flags {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    elif any(not isinstance(v, bool) for v in flags.values()):
        problems.add("offload", "every flag must be true or false")
    else:
        return OffloadSettings(**flags)
    return OffloadSettings()


def _memory_sizes(raw: Mapping[str, Any], problems: Problems) -> dict[str, int | None]:
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


def _optional_bool(value: Any, name: str, problems: Problems) -> bool | None:
    if value is not None and not isinstance(value, bool):
        problems.add(name, f"must be true, false or unset (the policy default), got {echo(value)}")
        return None
    return value


def _int_at_least(value: Any, minimum: int, name: str, problems: Problems) -> int | None:
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


