"""`--plan fastest`: the configurations one generate could run in, each forecast against its walls and timed
from this machine's history, and the fastest that fits chosen.

Candidates are residency (resident, sequential) x weight precision x the lever
sets allowed. Lossless only by default: bf16 weights, the attention backends the
device runs, the DiT's compile and the VAE decoder's compile each off and on;
with lossy levers allowed, also the int8 / fp8 weights and fp8 compute the
device runs, SageAttention where it is installed, and the TaylorSeer step
cache. What the request itself names is always a candidate. Candidates are
listed in the order of preference (`PREFERENCE`).

Each candidate is checked against the same walls, in the same words, as
`jobs submit` (`machine.walls`): its stages on top of the job's process
start-up (learned from this machine's jobs; unknown without history, and the
table says which). Its seconds include each lever's start-up, the stages a
lever adds once per run whatever the steps (`models.speed.levers.STARTUP_STAGES`:
the DiT compile's first calls, the VAE decoder compile's first call), timed
from history as the forecast's work has them; the table says how much of each
candidate's seconds that is.

The choice: among candidates that fit, the fewest predicted seconds where every
stage has history on this machine for that lever set; when no fitting candidate
has it, the first that fits in the order of preference, and the plan says so. No
lever's speedup is assumed without history (nor from another lever set's): the
order of preference keeps to the request, so without history the plan changes
only what it must to fit. When none fits, the refusal is the first candidate's
fit verdict (`machine.walls.verdict`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterable

from machine.walls import StageNeed, WallCheck, Walls, job_needs, tightest, verdict, wall_checks

from ..forecast.eta import NO_HISTORY, StageEta, StageRecord, estimate, stage_work, total_seconds
from ..forecast import GenerateForecast
from .levers import (ATTENTION_BACKENDS, LEVER_FIELDS, STARTUP_STAGES, attention_problem, compile_problem, is_lossless,
                     lever_option, levers_of)
from ..request.params import GenerateParams, GenerateParamsError
from ..quantization.check import FP8_COMPUTE

PREFERENCE = ("the request's own levers before others (no speedup is assumed without history)",
              "resident before sequential (no component loaded twice)",
              "bf16 weights before fp8 compute, fp8 and int8")
"""The order candidates are listed and, without history, chosen in."""
SECONDS_NOTE = "seconds include each lever's start-up (the compiles' first calls, their own stages)"
"""What a plan's seconds count, said above its table."""
PRECISIONS = (None, FP8_COMPUTE, "fp8", "int8")
"""Weight precisions in the order of preference (None: bf16)."""

WallChecks = Callable[[GenerateForecast], "list[WallCheck]"]
"""A forecast -> every stage against every wall of the run (`machine.walls.wall_checks`)."""


@dataclass(frozen=True)
class Candidate:
    """One configuration the plan considered."""

    sequential: bool
    """Per-stage residency (load each component before its first block, release it after its last)."""
    levers: dict[str, Any]
    """The lever fields of GenerateParams (`models.speed.levers.LEVER_FIELDS`)."""
    lossless: bool
    """Whether every lever of it is lossless (`models.speed.levers`)."""
    peaks: dict[str, int]
    """Forecast host + device bytes per stage."""
    over_stage: str | None
    """The stage that does not fit (None when all fit)."""
    wall: str | None
    """The stage nearest its wall against it, in one line (`... would peak at 1.2 GiB, under the 64.0 GiB budget`):
    the one that does not fit, when one does not."""
    refusal: str | None
    """The fit verdict when it does not fit (`refused: needs 1.2 GiB, over the 1.0 GiB MemAvailable`), else None."""
    wall_name: str | None
    """The wall nearest it (`budget`, `available`, `limit`, `device`; `machine.walls.WallCheck.wall`)."""
    need: int | None
    """What the whole run needs of that wall: its largest stage there."""
    seconds: float | None
    """Predicted seconds from this machine's history, each lever's start-up included; None without history for
    every stage."""
    startup_seconds: float | None
    """Of `seconds`, the levers' start-up (`STARTUP_STAGES`: the compiles' first calls); 0.0 when it has none."""
    not_counted: list[str]
    """Lever memory the forecast cannot know (`GenerateForecast.not_counted`)."""

    @property
    def fits(self) -> bool:
        return self.over_stage is None

    @property
    def label(self) -> str:
        """`resident · bf16 · flash attention (torch) + regional compile`."""
        precision = self.levers.get("quantize") or "bf16"
        options = [o.label for o in levers_of(self.levers) if o.field != "quantize"]
        return " · ".join(["sequential" if self.sequential else "resident", precision,
                           " + ".join(options) or "no lever"])

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits, "label": self.label}


@dataclass(frozen=True)
class Plan:
    """Every candidate, the one chosen and why."""

    candidates: list[Candidate]
    """In the order of preference."""
    chosen: int | None
    """Index of the candidate used; None when none fits."""
    why: str
    """One line: how it was chosen, or what does not fit."""
    lossy: bool
    """Whether lossy levers were allowed."""
    startup: str
    """How the walls counted the job's process start-up, in words (`startup_words`)."""

    @property
    def choice(self) -> Candidate | None:
        return None if self.chosen is None else self.candidates[self.chosen]

    def to_dict(self) -> dict[str, Any]:
        return {"candidates": [c.to_dict() for c in self.candidates], "chosen": self.chosen, "why": self.why,
                "lossy": self.lossy, "startup": self.startup, "preference": list(PREFERENCE)}


def candidate_settings(params: GenerateParams, device: str, capability: tuple[int, int] | None, *, lossy: bool,
                       sequential: bool | None) -> list[tuple[bool, dict[str, Any]]]:
    """(sequential, lever values) of every candidate the device runs, in the order of preference; `sequential`
    set by the user leaves residency alone."""
    from ..quantization.check import quantization_problem, torchao_installed

    asked = {name: getattr(params, name) for name in LEVER_FIELDS}

    def allowed(field: str, value: Any) -> bool:
        option = lever_option(field, value)
        return option is None or option.lossless or lossy or value == asked[field]

    torchao = torchao_installed()
    precisions = [q for q in dict.fromkeys((asked["quantize"], *PRECISIONS))
                  if allowed("quantize", q) and quantization_problem(q, device, capability, torchao) is None]
    backends = [b for b in dict.fromkeys((asked["attention"], *ATTENTION_BACKENDS))
                if allowed("attention", b) and attention_problem(b, device, capability) is None]
    caches = [c for c in dict.fromkeys((asked["step_cache"], None, "taylorseer")) if allowed("step_cache", c)]
    compiles = (True, False) if compile_problem(device) is None else (False,)
    vae_compiles = compiles
    if params.parallel > 1:  # a parallel run takes neither yet (models.request.params)
        caches, compiles = [None], (False,)
    residencies = [False, True] if sequential is None else [sequential]
    found = [(s, {"attention": a, "compile": c, "quantize": q, "step_cache": k, "vae_compile": v})
             for s in residencies for q in precisions for a in backends for c in compiles for k in caches
             for v in vae_compiles]

    def preference(item: tuple[bool, dict[str, Any]]) -> tuple:
        seq, values = item
        changed = sum(values[name] != asked[name] for name in LEVER_FIELDS)
        return changed, seq, PRECISIONS.index(values["quantize"])
    return sorted(found, key=preference)


def plan_fastest(params: GenerateParams, *, device: str, capability: tuple[int, int] | None, device_key: str,
                 forecast_for: Callable[[GenerateParams, bool], GenerateForecast], check: WallChecks,
                 records: Iterable[StageRecord], startup: str, lossy: bool = False,
                 sequential: bool | None = None) -> Plan:
    """Forecast and time every candidate (`forecast_for(params, sequential)`, `check` against the walls, `records`
    of `device_key`) and choose the fastest that fits; `startup` says how `check` counts the process start-up.
    GenerateParamsError when the device cannot run a lever the request itself names, as `jobs submit` refuses it:
    the plan never puts another lever in its place unsaid."""
    from ..forecast import lever_memory_unknown
    from .levers import lever_key, lever_problems
    from ..lora.inputs import lora_key

    refused = lever_problems(params.to_dict(), device, capability)
    if refused:
        raise GenerateParamsError(refused)

    records = list(records)
    loras = lora_key(params.to_dict())  # the same for every candidate
    forecasts: dict[tuple, GenerateForecast] = {}
    candidates = []
    for seq, values in candidate_settings(params, device, capability, lossy=lossy, sequential=sequential):
        candidate = replace(params, **values)
        # The bytes depend on residency, precision and the step cache only; the attention backend and the compiles
        # change what the forecast says it cannot count, and the compiles the stages' work.
        key = (seq, values["quantize"], values["step_cache"])
        if key not in forecasts:
            forecasts[key] = forecast_for(candidate, seq)
        forecast = replace(forecasts[key], levers=dict(values), not_counted=lever_memory_unknown(candidate))
        checks = check(forecast)
        nearest = tightest(checks)
        need = job_needs(checks)[nearest.wall] if nearest is not None else None
        over = nearest is not None and nearest.over
        etas = estimate(stage_work(forecast), records, device_key, lever_key(values), loras)
        candidates.append(Candidate(
            seq, values, is_lossless(values), {s.stage: s.total_bytes for s in forecast.stages},
            nearest.stage if over else None, nearest.line if nearest else None,
            verdict(nearest, need) if over else None, nearest.wall if nearest else None, need,
            total_seconds(etas), startup_seconds(etas), list(forecast.not_counted)))
    chosen, why = choose(candidates)
    return Plan(candidates, chosen, why, lossy, startup)


def startup_seconds(etas: Iterable[StageEta]) -> float | None:
    """The seconds of the levers' start-up stages among `etas` (0.0 with none; None when one has no history)."""
    found = [e.seconds for e in etas if e.stage in STARTUP_STAGES]
    return None if any(v is None for v in found) else float(sum(found))


def stage_needs(forecast: GenerateForecast) -> list[StageNeed]:
    """What each stage of a generate holds above its process (the walls' `needs`); a reference clip's decode is a
    stage of its own before any weight."""
    needs = [StageNeed(s.stage, s.host_bytes, s.device_bytes, 0) for s in forecast.stages]
    if forecast.clip_decode_bytes:
        from ..inputs.clips import READ_CLIP

        needs.insert(0, StageNeed(READ_CLIP, forecast.clip_decode_bytes, 0, 0))
    return needs


def startup_words(startup_bytes: int | None, basis: str) -> str:
    """How a plan's walls count the job's process start-up: learned, or unknown without history."""
    from core.sizes import format_size

    if startup_bytes is None:
        return f"the process start-up is not counted: {basis}"
    return f"each counts the process start-up, {format_size(startup_bytes)} ({basis})"


def choose(candidates: list[Candidate]) -> tuple[int | None, str]:
    """The index of the fastest candidate that fits (by history, else the first in the order of preference) and
    why, in one line."""
    fitting = [i for i, c in enumerate(candidates) if c.fits]
    if not fitting:
        if not candidates:
            return None, "no candidate runs on this device"
        return None, (f"{candidates[0].refusal} (none of the {len(candidates)} candidates of --plan fastest fits;"
                      f" the first in the order of preference: {candidates[0].label})")
    timed = [i for i in fitting if candidates[i].seconds is not None]
    if timed:
        best = min(timed, key=lambda i: candidates[i].seconds)
        untimed = len(fitting) - len(timed)
        return best, (f"the fastest of {len(timed)} that fit with history on this machine: "
                      f"{candidates[best].seconds:.1f} s predicted"
                      + (f"; {untimed} that fit have {NO_HISTORY} and were not compared" if untimed else ""))
    return fitting[0], (f"{NO_HISTORY} for any candidate that fits: the first that fits in the order of preference ("
                        + "; ".join(PREFERENCE) + ")")


def planned(params: GenerateParams, plan: Plan) -> tuple[GenerateParams, bool]:
    """The request as the chosen candidate runs it, and its residency."""
    choice = plan.choice
    if choice is None:
        raise ValueError(plan.why)
    return replace(params, **choice.levers), choice.sequential


def machine_check(kind: str, unified: bool, total_memory: int | None, name: str, available: int,
                  startup: int = 0) -> WallChecks:
    """The walls of a run outside the queue (`models generate` / `forecast --plan`): MemAvailable now for what the
    host holds (host and device on a CPU or unified memory), the GPU's memory for a discrete GPU's side, each host
    wall counting the process's `startup` (learned; 0 when unknown). A job's walls add its budget, floor and limit
    (`jobs.kinds.generate.plan_job`)."""
    shared = kind == "cpu" or unified
    walls = Walls(available, shared=shared, device_total=None if shared else total_memory, device_name=name)

    def check(forecast: GenerateForecast) -> list[WallCheck]:
        return wall_checks(stage_needs(forecast), walls, startup + forecast.process_host_bytes,
                           forecast.process_device_bytes)
    return check


def seconds_words(candidate: dict[str, Any]) -> str:
    """A recorded candidate's seconds for a table: `41.0 s (30.2 s start-up)`, `12.3 s`, or "no history"."""
    if candidate["seconds"] is None:
        return NO_HISTORY
    startup = candidate.get("startup_seconds")
    return f"{candidate['seconds']:.1f} s" + (f" ({startup:.1f} s start-up)" if startup else "")


def plan_note(plan: dict[str, Any]) -> str:
    """What a recorded plan's seconds and walls count, in one line (said above or under its table)."""
    return f"{SECONDS_NOTE}; walls: {plan.get('startup') or 'the process start-up is not counted'}"


def plan_lines(plan: dict[str, Any]) -> list[str]:
    """A recorded plan (`Plan.to_dict`) for a terminal: what the seconds and walls count, one line per candidate
    (`*` chosen, `x` does not fit, with the stage), then the choice and why."""
    from core.sizes import format_size

    lines = [f"plan: {len(plan['candidates'])} candidates ({'lossy allowed' if plan['lossy'] else 'lossless only'});"
             f" {plan_note(plan)}"]
    for i, c in enumerate(plan["candidates"]):
        mark = "*" if i == plan["chosen"] else ("x" if not c["fits"] else " ")
        peak = max(c["peaks"].items(), key=lambda kv: kv[1], default=("-", 0))
        fit = f"does not fit: {c['wall']}" if not c["fits"] else f"peak {format_size(peak[1])} at {peak[0]}"
        lines.append(f" {mark} {c['label']}: {fit}; {seconds_words(c)}")
    lines.append(f"why: {plan['why']}")
    return lines
