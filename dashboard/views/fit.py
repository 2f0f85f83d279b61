""""Will it fit?": the submit check's own verdict (jobs.admission), drawn as the Run page's bar and one line.

The bar and its line use the numbers the submit check refuses with, so the page
never says a job fits that the submit check, or the memory guard, would stop:
every host wall counts the job's process start-up (learned from this machine's
past jobs) with its stage, as the guard counts growth over the job's start
(docs/metrics.md, "A job's memory"). Without that history the verdict says the
process is not counted yet, never "Fits". A refused load names a cheaper
placement mode that fits, from the loader's own forecast per mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from dashboard import format as fmt

TIGHT = 0.8
"""Share of a wall's allowance from which the forecast says "tight" (amber)."""


@dataclass(frozen=True)
class Wall:
    """One limit a job's peak must stay under."""

    name: str
    """budget, available, limit or device (jobs.admission's walls)."""
    allowance: int
    """Bytes the job may add before it hits this wall (may be <= 0: already hit)."""
    label: str
    """How the message names it: "the 1.00 GiB memory limit"."""


@dataclass(frozen=True)
class Forecast:
    """What the fit panel shows."""

    stage: str
    """The stage nearest its wall."""
    predicted_peak: int
    """Bytes the job is predicted to add at that stage, as the wall counts them."""
    wall: Wall
    """The tightest wall."""
    share: float
    """predicted_peak / wall.allowance (inf when the wall is already hit)."""
    message: str
    """What to tell the user."""
    process_known: bool = True
    """Whether the job's own process is in the count (this machine has history of it)."""

    @property
    def level(self) -> str:
        """ok, tight or over: the colour of the message (never ok while the process is not counted)."""
        level = "ok" if self.share <= TIGHT else "tight" if self.share <= 1.0 else "over"
        return "tight" if level == "ok" and not self.process_known else level


def _share(peak: int, allowance: int) -> float:
    return peak / allowance if allowance > 0 else float("inf")


def load_peaks(path: str, *, component: str | None, dtype: str | None, device, roots) -> dict[str, int] | None:
    """Predicted peak per registered mode from the loader's own forecast (headers only), or None when it cannot
    say."""
    from core import DrainboardError
    from loader.forecast import forecast_load
    from loader.placement import known_placements

    try:
        return {
            mode: forecast_load(path, component=component, mode=mode, device=device.spec, dtype=dtype,
                                roots=roots, device_info=device).predicted_peak_bytes
            for mode in known_placements()
        }
    except DrainboardError:
        return None


def cheaper_mode(mode: str, peaks: Mapping[str, int], need: int, allowance: int) -> str | None:
    """A cheaper mode whose need (this one's, less the difference of their loads' peaks) fits `allowance`, as a
    sentence, or None."""
    for other, peak in sorted(peaks.items(), key=lambda item: item[1]):
        other_need = need - peaks[mode] + peak
        if other != mode and peak < peaks[mode] and other_need <= allowance:
            return f"The {other} mode needs {fmt.gib(other_need)} and fits."
    return None


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


def submit_fit(found: Mapping, in_use: int) -> SubmitFit:
    """The bar and the one line for an Admission dict (`found`): the whole job's need against its tightest wall,
    in the page's words (the remedy a page user can act on, never a CLI flag)."""
    from jobs.admission import remedy

    tightest = found["tightest"]
    peak, allowance = int(tightest["peak"]), int(tightest["allowance"])
    name = tightest["wall"]
    share = _share(peak, allowance)
    need = int(found.get("need") or peak)
    known = found.get("startup") is not None
    if share > 1.0:
        message = f"Will not fit: needs {fmt.gib(need)}, over {tightest['label']}: {remedy(name, need, cli=False)}."
    elif not known:
        message = (f"Fits only if its process is small: the stages alone need {fmt.gib(need)}, under "
                   f"{tightest['label']}; this machine has no history of a job's own process yet (its first job "
                   f"measures it).")
    elif share <= TIGHT:
        message = f"Fits: needs {fmt.gib(need)}, {fmt.gib(allowance - need)} to spare under {tightest['label']}."
    else:
        message = f"Tight: needs {fmt.gib(need)}, {fmt.percent(need / allowance)} of what {tightest['label']} allows."
    shown = tightest.get("floor") if name == "available" and tightest.get("floor") else allowance
    word = "floor" if name == "available" and tightest.get("floor") else WALL_WORDS.get(name, name)
    wall = Wall(name, allowance, tightest["label"])
    return SubmitFit(Forecast(tightest["stage"], peak, wall, share, message, known),
                     0 if name == "device" else in_use, f"{word} {fmt.gib(shown)}")
