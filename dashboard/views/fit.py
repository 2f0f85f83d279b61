""""Will it fit?": a job's predicted peak against every wall the user set.

A job may hit one of four walls: the pool itself (device memory, or the host's
MemTotal on unified memory and CPU), its memory limit (the cgroup counts only
the job's own process tree, which starts at the worker's baseline), its memory
budget (growth of system in use over the job's start) and the MemAvailable
floor (system in use may not come within the floor of the total). Each wall
becomes "how many bytes this job may add"; the forecast checks the tightest and
names a cheaper mode that fits when the chosen one does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from dashboard import format as fmt

MODE_RATIO = {"stream": 1.0, "drain": 1.16, "retain": 2.0}
"""Measured peak footprint per mode (bytes added per byte placed; docs/benchmarks.md), cheapest first."""

TIGHT = 0.8
"""Share of a wall's allowance from which the forecast says "tight" (amber)."""


@dataclass(frozen=True)
class Wall:
    """One limit a job's peak must stay under."""

    name: str
    """pool, limit, budget or floor."""
    allowance: int
    """Bytes the job may add before it hits this wall (may be <= 0: already hit)."""
    label: str
    """How the message names it: "the 1.0 GiB memory limit"."""


def walls(*, in_use: int, capacity: int, limit: int | None = None, limit_baseline: int = 0,
          budget: int | None = None, floor: int | None = None) -> list[Wall]:
    """Every wall that applies, the pool first. `limit_baseline` is what the worker
    process holds before it places anything (the cgroup counts it too)."""
    found = [Wall("pool", capacity - in_use, f"the {fmt.gib(capacity)} pool ({fmt.gib(in_use)} in use now)")]
    if limit is not None:
        found.append(Wall("limit", limit - limit_baseline, f"the {fmt.gib(limit)} memory limit"))
    if budget is not None:
        found.append(Wall("budget", budget, f"the {fmt.gib(budget)} memory budget"))
    if floor is not None:
        found.append(Wall("floor", capacity - floor - in_use, f"the {fmt.gib(floor)} MemAvailable floor"))
    return found


@dataclass(frozen=True)
class Forecast:
    """What the fit panel shows."""

    mode: str
    """The mode forecast."""
    predicted_peak: int
    """Bytes the job is predicted to add at its peak."""
    wall: Wall
    """The tightest wall."""
    share: float
    """predicted_peak / wall.allowance (inf when the wall is already hit)."""
    message: str
    """What to tell the user, with a cheaper mode that fits when this one does not."""

    @property
    def level(self) -> str:
        """ok, tight or over: the colour of the message."""
        return "ok" if self.share <= TIGHT else "tight" if self.share <= 1.0 else "over"


def _share(peak: int, allowance: int) -> float:
    return peak / allowance if allowance > 0 else float("inf")


def forecast(mode: str, peaks: Mapping[str, int], found: list[Wall]) -> Forecast:
    """The forecast for `mode`, given each mode's predicted peak (`peaks`) and the walls."""
    peak = peaks[mode]
    wall = min(found, key=lambda w: w.allowance)
    share = _share(peak, wall.allowance)
    if share <= TIGHT:
        message = f"Fits: predicted peak {fmt.gib(peak)}, {fmt.gib(wall.allowance - peak)} to spare under {wall.label}."
    elif share <= 1.0:
        message = f"Tight: predicted peak {fmt.gib(peak)} is {fmt.percent(share)} of what {wall.label} leaves ({fmt.gib(wall.allowance)})."
    else:
        message = f"Will not fit under {wall.label}: predicted peak {fmt.gib(peak)}, {fmt.gib(max(wall.allowance, 0))} allowed."
        message += " " + _cheaper(mode, peaks, wall)
    return Forecast(mode, peak, wall, share, message)


def _cheaper(mode: str, peaks: Mapping[str, int], wall: Wall) -> str:
    """A cheaper mode that fits under `wall`, or what the wall would have to be."""
    for other, peak in sorted(peaks.items(), key=lambda item: item[1]):
        if other != mode and peak < peaks[mode] and peak <= wall.allowance:
            return f"{other} ({fmt.gib(peak)}) fits, with {fmt.gib(wall.allowance - peak)} to spare."
    cheapest = min(peaks, key=peaks.get)
    need = fmt.gib(peaks[cheapest] - wall.allowance)
    remedy = {"pool": f"free {need} first", "limit": f"raise the limit by {need}",
              "budget": f"raise the budget by {need}", "floor": f"lower the floor by {need}"}[wall.name]
    return f"No mode fits: the cheapest, {cheapest}, needs {fmt.gib(peaks[cheapest])}; {remedy}, or place a smaller dtype."


def load_peaks(path: str, *, component: str | None, dtype: str | None, device, roots) -> dict[str, int] | None:
    """Predicted peak per mode from the loader's own forecast (headers only), or None when it cannot say."""
    from core import DrainboardError
    from loader.forecast import forecast_load

    try:
        return {
            mode: forecast_load(path, component=component, mode=mode, device=device.spec, dtype=dtype,
                                roots=roots, device_info=device).predicted_peak_bytes
            for mode in MODE_RATIO
        }
    except DrainboardError:
        return None


def mode_peaks(bytes_to_place: int) -> dict[str, int]:
    """Predicted peak per mode from the measured ratios, for a checkpoint of `bytes_to_place` bytes."""
    return {mode: int(ratio * bytes_to_place) for mode, ratio in MODE_RATIO.items()}


WALL_WORDS = {"budget": "budget", "available": "MemAvailable", "limit": "limit", "device": "device"}
"""The fit bar's caption word per jobs.admission wall."""


@dataclass(frozen=True)
class SubmitFit:
    """The fit bar of a job the submit check assessed: its tightest stage and wall (jobs.admission.WallCheck)."""

    forecast: Forecast
    """Peak, wall, share and message, as the bar and its line draw them."""
    base: int
    """What the bar shows in use before the job: system in use now, or 0 against a GPU's own memory."""
    caption: str
    """The wall's caption: its kind and the size it stands for (the floor, when one is set, for MemAvailable)."""


def submit_fit(tightest: Mapping, in_use: int) -> SubmitFit:
    """The bar and line for `tightest` (an Admission's `tightest` dict), with the submit check's own numbers:
    the refusal line, word for word, when it is over."""
    peak, allowance = int(tightest["peak"]), int(tightest["allowance"])
    name = tightest["wall"]
    share = _share(peak, allowance)
    line = tightest["line"]
    if share <= TIGHT:
        message = f"Fits: {line}, {fmt.gib(allowance - peak)} to spare."
    elif share <= 1.0:
        message = f"Tight: {line}, {fmt.percent(share)} of what it allows."
    else:
        message = f"Will not fit: refused: {line}."
    shown = tightest.get("floor") if name == "available" and tightest.get("floor") else allowance
    word = "floor" if name == "available" and tightest.get("floor") else WALL_WORDS.get(name, name)
    wall = Wall(name, allowance, tightest["label"])
    return SubmitFit(Forecast(tightest["stage"], peak, wall, share, message), 0 if name == "device" else in_use,
                     f"{word} {fmt.gib(shown)}")
