"""Seconds per stage of a generate run, from this machine's own history of stage timings.

Each past stage becomes a rate: seconds per unit of work, where the work is
what the stage's time scales with (`stage_work`): prompt tokens x text-encoder
bytes, DiT calls x packed rows x DiT bytes, pixels x video-VAE bytes, audio
samples x audio-VAE bytes, and a component's bytes for its load. The estimate
is the median rate of the same stage on the same device times the new run's
work. Where the machine has no such stage yet there is no estimate, and the
result says so instead of inventing a number. Plain records in, no storage:
`jobs.history` reads the job history and hands the records in.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from .stages import GenerateForecast
from ..speed.levers import COMPILE_CALLS, COMPILE_STAGE, STAGE_LEVERS, VAE_COMPILE_STAGE, key_part
from ..lora.inputs import LORA_STAGES

NO_HISTORY = "no history on this machine"
"""The basis of a stage with no past timing."""


@dataclass(frozen=True)
class StageRecord:
    """One stage of one past run."""

    stage: str
    """Stage name (`text_encoder`, `denoise.denoise`, `load.transformer`, ...)."""
    seconds: float
    """Wall seconds it took."""
    work: float
    """Its work in `stage_work` units."""
    device: str
    """Where it ran (`device_key`)."""
    levers: str = ""
    """The run's lever set (`models.speed.levers.lever_key`; "" for none): a stage the levers change is learned per setting
    of the levers that change it (`models.speed.levers.STAGE_LEVERS`)."""
    loras: str = ""
    """The run's LoRA set (`models.lora.inputs.lora_key`; "" for none): a stage LoRAs change (`LORA_STAGES`) is
    learned per LoRA set."""


@dataclass(frozen=True)
class StageEta:
    """The predicted seconds of one stage."""

    stage: str
    """Stage name."""
    seconds: float | None
    """Predicted wall seconds; None without history."""
    basis: str
    """Where the number comes from ("median of 3 past runs") or NO_HISTORY."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def device_key(kind: str, name: str) -> str:
    """How history tells machines' devices apart: `cuda:NVIDIA H200`, `cpu:AMD EPYC ...`."""
    return f"{kind}:{name}"


def stage_work(forecast: GenerateForecast) -> dict[str, float]:
    """The work of every stage the run will time, loads included."""
    sizes = forecast.component_bytes
    compiled = bool(forecast.levers.get("compile"))
    units = {
        "text_encoder": forecast.text_tokens,
        # A compiled DiT's calls that compile are their own stage (one unit: the compiles are paid once per run).
        "denoise.denoise": forecast.tokens * max(forecast.steps - 1 - compiled * COMPILE_CALLS, 1),
        "decode.video": forecast.frames * forecast.height * forecast.width,
        "decode.audio": next((s.driver for s in forecast.stages if s.stage == "decode.audio"), 0.0),
    }
    # A load's work is the bytes it places; its LoRAs add their factors' bytes (read, converted and merged as the
    # weights come up). A merged LoRA changes no DiT call, so the denoise work needs no LoRA term; its steps are in
    # its work already.
    work = {f"load.{s.component}": float(sizes[s.component] + forecast.lora_work.get(s.component, 0))
            for s in forecast.stages}
    # Preparing a component's LoRAs (`models.run.state.lora_stage`: hashing each file, converting its header) scales
    # by the same bytes.
    work.update({f"lora.{c}": float(n) for c, n in forecast.lora_work.items() if n})
    # A stage without a unit of its own here (fl2va's / ref2va's vae_encoder) scales by its forecast driver.
    work.update({s.stage: float(units.get(s.stage, s.driver)) * sizes[s.component] for s in forecast.stages})
    if compiled:
        work[COMPILE_STAGE] = 1.0
    if forecast.levers.get("vae_compile"):
        # The decoder's first call (one tile of one chunk) is its own stage; the decode's work is left whole.
        work[VAE_COMPILE_STAGE] = 1.0
    return work


def estimate(work: dict[str, float], records: Iterable[StageRecord], device: str, levers: str = "",
             loras: str = "") -> list[StageEta]:
    """Seconds per stage of `work` on `device` from `records` (any device's; only `device`'s count); a stage the
    levers change counts only runs with the same setting of the levers that change it (of lever set `levers`), and
    a stage LoRAs change only runs of the same LoRA set `loras`, so neither borrows another's speed (a CPU merge's
    arithmetic can outlast the load itself)."""
    rates: dict[str, list[float]] = {}
    for r in records:
        fields = STAGE_LEVERS.get(r.stage)
        if fields is not None and key_part(r.levers, fields) != key_part(levers, fields):
            continue
        if r.stage in LORA_STAGES and r.loras != loras:
            continue
        if r.device == device and r.work > 0 and r.seconds >= 0:
            rates.setdefault(r.stage, []).append(r.seconds / r.work)
    out = []
    for stage, amount in work.items():
        found = rates.get(stage)
        if not found:
            out.append(StageEta(stage, None, NO_HISTORY))
        else:
            out.append(StageEta(stage, statistics.median(found) * amount,
                                f"median of {len(found)} past run{'s' * (len(found) != 1)}"))
    return out


def total_seconds(etas: Iterable[StageEta]) -> float | None:
    """The run's predicted seconds, or None when any stage has no history (a partial sum would mislead)."""
    values = [e.seconds for e in etas]
    return None if not values or any(v is None for v in values) else sum(values)


def time_left(etas: Iterable[StageEta], done: Iterable[str], current: str | None, current_elapsed: float,
              step_share: float | None = None) -> float | None:
    """Seconds left: the stages not started, plus what remains of the current one (by its steps where the
    share done is known, else by its elapsed time, never below zero). None without history for any of them."""
    finished = set(done)
    left = 0.0
    for e in etas:
        if e.stage in finished:
            continue
        if e.seconds is None:
            return None
        if e.stage == current:
            remaining = e.seconds * (1 - step_share) if step_share is not None else e.seconds - current_elapsed
            left += max(remaining, 0.0)
        else:
            left += e.seconds
    return left
