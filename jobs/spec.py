"""Job specs and their validation, done in the submitting process before anything is queued.

`build_spec(raw, config)` turns user input (CLI flags, dashboard form) into a
`JobSpec` or raises `JobSpecError` naming every bad field; a stored spec is
read back with `JobSpec.from_dict`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from loader.device import parse_device_spec
from loader.dtypes import parse_dtype
from loader.errors import DeviceError, DrainboardError, PlacementError
from loader.placement import known_placements
from loader.offload import OffloadSettings
from models.params import GenerateParams, GenerateParamsError, ModelSpec, validate_params
from storage.config import Config, ModelPathError, resolve_model_path

_SIZE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


class JobSpecError(DrainboardError):
    """A job spec is invalid; nothing was queued. `field` names the first bad field,
    `errors` lists every problem as "field: message"."""

    def __init__(self, field: str, message: str, errors: list[str] | None = None):
        self.field = field
        self.errors = errors or [f"{field}: {message}"]
        text = self.errors[0] if len(self.errors) == 1 else f"{len(self.errors)} problems: " + "; ".join(self.errors)
        super().__init__(text)

    def messages(self) -> list[str]:
        return list(self.errors)


def parse_size(text: str | int) -> int:
    """Bytes from '700MB', '4GiB', '512k' or a plain integer; decimal and binary units both work."""
    if isinstance(text, int) and not isinstance(text, bool):
        size = text
    else:
        match = _SIZE.match(str(text))
        if match is None:
            raise ValueError(f"{text!r} is not a size; expected a number with an optional unit such as 700MB or 4GiB")
        unit = (match.group(2) or "").lower().removesuffix("b")
        size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return size


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
    generate: GenerateParams | None = None
    """Generate parameters; set exactly when kind is `generate`."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobSpec":
        """Rebuild a stored spec (already validated when it was queued)."""
        values = dict(data)
        values["offload"] = OffloadSettings(**values.get("offload", {}))
        if values.get("generate") is not None:
            values["generate"] = GenerateParams(**values["generate"])
        return cls(**values)


def build_spec(raw: Mapping[str, Any], config: Config, *, known_kinds: tuple[str, ...] | None = None) -> JobSpec:
    """Validate user input and return the spec to queue, or raise `JobSpecError` listing every bad field.

    `raw` has JobSpec's field names; `generate` and `offload` are mappings;
    `memory_limit` may be a size string. The model path must exist under one
    of `config.model_roots`. `known_kinds` defaults to the registered kinds.
    """
    from jobs.kinds import kind_names
    from jobs.cgroups import memory_limit_support

    errors: list[tuple[str, str]] = []

    def bad(name: str, message: str) -> None:
        errors.append((name, message))

    spec_fields = {f.name for f in fields(JobSpec)}
    for name in sorted(set(raw) - spec_fields):
        bad(name, f"unknown field; known: {', '.join(sorted(spec_fields))}")
    kinds = known_kinds if known_kinds is not None else kind_names()
    kind = raw.get("kind")
    if kind not in kinds:
        bad("kind", f"unknown job kind {kind!r}; known: {', '.join(kinds)}")

    model = raw.get("model")
    if not model:
        bad("model", "a checkpoint path is required")
    else:
        try:
            model = str(resolve_model_path(model, config.model_roots))
        except ModelPathError as e:
            bad("model", str(e))

    component = raw.get("component") or None
    if component is not None and (not isinstance(component, str) or not re.fullmatch(r"[\w.-]+", component)
                                  or component in (".", "..")):
        bad("component", f"must be a folder name such as transformer, got {component!r}")

    mode = raw.get("mode", "stream")
    if mode not in known_placements():
        bad("mode", f"unknown placement mode {mode!r}; known: {', '.join(known_placements())}")

    device = raw.get("device", "cpu")
    try:
        parse_device_spec(device)
    except DeviceError as e:
        bad("device", str(e))

    dtype = raw.get("dtype") or None
    if dtype is not None:
        try:
            dtype = str(parse_dtype(str(dtype))).removeprefix("torch.")
        except PlacementError as e:
            bad("dtype", str(e))

    offload = OffloadSettings()
    offload_raw = raw.get("offload") or {}
    flag_names = {f.name for f in fields(OffloadSettings)}
    unknown_flags = sorted(set(offload_raw) - flag_names)
    if unknown_flags:
        bad("offload", f"unknown flags {', '.join(unknown_flags)}; known: {', '.join(sorted(flag_names))}")
    elif any(not isinstance(v, bool) for v in offload_raw.values()):
        bad("offload", "every flag must be true or false")
    else:
        offload = OffloadSettings(**offload_raw)

    sample_every = _int_at_least(raw.get("sample_every", 1), 1, "sample_every", bad)
    gpus = _int_at_least(raw.get("gpus", 1), 1, "gpus", bad)
    if gpus is not None and gpus > 1 and not str(device).startswith("cuda"):
        bad("gpus", f"{gpus} GPUs need a cuda device, got {device!r}")

    memory_limit = None
    if raw.get("memory_limit") not in (None, ""):
        try:
            memory_limit = parse_size(raw["memory_limit"])
        except ValueError as e:
            bad("memory_limit", str(e))
        else:
            reason = memory_limit_support()
            if reason is not None:
                bad("memory_limit", f"per-job memory limits are not available here: {reason}")

    generate = None
    if kind == "generate":
        generate = _generate_params(raw.get("generate") or {}, bad)
        model_ok = model and not any(name == "model" for name, _ in errors)
        if generate is not None and model_ok:
            _check_against_model(generate, model, bad)
    elif raw.get("generate"):
        bad("generate", f"generate parameters only apply to generate jobs, not {kind!r}")

    if errors:
        raise JobSpecError(errors[0][0], errors[0][1], [f"{name}: {message}" for name, message in errors])
    return JobSpec(kind=kind, model=model, component=component, mode=mode, device=device.strip(), dtype=dtype,
                   offload=offload, sample_every=sample_every, memory_limit=memory_limit, gpus=gpus, generate=generate)


def _int_at_least(value: Any, minimum: int, name: str, bad) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value))
        except ValueError:
            bad(name, f"must be an integer, got {value!r}")
            return None
    if value < minimum:
        bad(name, f"must be at least {minimum}, got {value}")
        return None
    return value


def _generate_params(raw: Mapping[str, Any], bad) -> GenerateParams | None:
    """Types only (names, ints, a float, a bool, strings): the ranges are the model's to judge."""
    names = {f.name for f in fields(GenerateParams)}
    for name in sorted(set(raw) - names):
        bad(f"generate.{name}", f"unknown parameter; known: {', '.join(sorted(names))}")
    values = {k: v for k, v in raw.items() if k in names}
    ok = True
    for name in ("prompt", "negative_prompt"):
        if name in values and not isinstance(values[name], str):
            bad(f"generate.{name}", f"must be text, got {values[name]!r}")
            ok = False
    if "prompt" not in values:
        bad("generate.prompt", "a prompt is required")
        ok = False
    for name in ("frames", "height", "width", "steps", "seed", "fps"):
        if name in values:
            value = values[name]
            try:
                if isinstance(value, bool) or isinstance(value, float):
                    raise ValueError
                values[name] = int(str(value))
            except ValueError:
                bad(f"generate.{name}", f"must be an integer, got {value!r}")
                ok = False
    if "guidance_scale" in values:
        try:
            if isinstance(values["guidance_scale"], bool):
                raise ValueError
            values["guidance_scale"] = float(values["guidance_scale"])
        except (TypeError, ValueError):
            bad("generate.guidance_scale", f"must be a number, got {values['guidance_scale']!r}")
            ok = False
    if "audio" in values and not isinstance(values["audio"], bool):
        bad("generate.audio", f"must be true or false, got {values['audio']!r}")
        ok = False
    return GenerateParams(**values) if ok else None


def _check_against_model(params: GenerateParams, model: str, bad) -> None:
    """The models package's own validation (config.json and index headers only, no weights),
    each problem filed under `generate.<field>`, or under `model` when the folder is no generate model."""
    try:
        validate_params(params, ModelSpec.read(model))
    except GenerateParamsError as e:
        for name, message in sorted(e.problems.items()):
            bad("model" if name == "model" else f"generate.{name}", message)
