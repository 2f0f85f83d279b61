"""How a finished job ended, as plain functions: the banner's headline, cause and next step, the smallest
limit that would have worked, the retries worth offering, and the bounds and forecast it ran under."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from dashboard import format as fmt
from dashboard.views import failure
from dashboard.views.jobs import LiveStats, kill_kind, status_label


def error_text(job: dict) -> str:
    """The job's whole error: the full detail when the runner kept one, else the stored error."""
    return (job.get("error_detail") or job.get("error") or "").strip()


@dataclass(frozen=True)
class Outcome:
    """How a finished job ended, as the top of its page says it."""

    tone: str
    """st element to draw it with: success, info (a user's cancel), warning (interrupted) or error."""
    headline: str
    """One plain sentence: the status and where it happened."""
    cause: list[str]
    """The whole cause in plain words, one line each, near-identical lines folded (empty for a success):
    the signal and who sent it, the limit, the last sample, or every problem of the error. Shown on demand."""
    next_step: str | None = None
    """What to do now (a kill's remedy), or None."""
    raw: str = ""
    """The stored error as the runner wrote it, for whoever wants it verbatim."""
    suggested_limit: int | None = None
    """For a job killed at its memory limit: the smallest limit that would have worked."""


def outcome(job: dict, stats: LiveStats, total_bytes: int | None, *, samples: pd.DataFrame | None = None,
            predicted: int | None = None) -> Outcome:
    """The banner of a finished job: a headline, the next step, and the cause (nothing of it cut)."""
    status = job["status"]
    tone = {"succeeded": "success", "cancelled": "info", "interrupted": "warning"}.get(status, "error")
    text = error_text(job)
    if status == "killed" or status == "interrupted":
        # "<why>; last sample at ...": the cause and the last sample, each on its own line.
        why, split, last = text.partition("; last sample")
        cause = [failure.plain(why)] + ([failure.plain(f"Last sample{last}")] if split else [])
    else:
        cause = failure.sentences(text)
    if status == "succeeded":
        cause = []
    spec = job.get("spec") or {}
    needed = suggested_limit(job, stats, total_bytes, samples, predicted)
    step = failure.next_step(
        kill_kind(job), limit=killing_limit(job), budget=spec.get("memory_budget"), suggested_limit=needed,
        mode=spec.get("mode"),
    )
    return Outcome(tone, status_label(job, stats, total_bytes), cause, step, text, needed)


def suggested_limit(job: dict, stats: LiveStats, total_bytes: int | None, samples: pd.DataFrame | None,
                    predicted: int | None) -> int | None:
    """For a job killed at its memory limit: the smallest limit that would have worked. The submit check's own
    number where the job has one (what the Run page and a refusal said it needs of a limit: jobs.admission),
    else what it measured (failure.limit_needed)."""
    limit = killing_limit(job)
    if not limit:
        return None
    need = (((job.get("spec") or {}).get("forecast") or {}).get("needs") or {}).get("limit")
    if need:
        return int(need)
    usage = baseline = None
    if samples is not None and len(samples):
        column = samples["cgroup_usage"] if "cgroup_usage" in samples and samples["cgroup_usage"].notna().any() else samples["vm_rss"]
        usage, baseline = int(column.max()), int(column.dropna().iloc[0])
    fraction = stats.bytes_placed / total_bytes if total_bytes and job.get("kind", "load") == "load" else None
    return failure.limit_needed(limit=limit, usage_at_kill=usage, baseline=baseline, placed_fraction=fraction,
                                predicted_peak=predicted)


def mode_costs() -> dict[str, float]:
    """Each placement mode's typical footprint (`Placement.typical_footprint`), cheapest first: a retry after
    running out of memory offers only cheaper ones."""
    from loader.placement import placement_classes

    return {cls.name: cls.typical_footprint for cls in placement_classes()}


def retry_choices(job: dict, suggested: int | None = None) -> list[str]:
    """What a Retry button may offer: "same settings" (or, for a job killed at its memory limit,
    "a limit of N" with `suggested`: the same settings would be killed again), plus each cheaper
    placement mode when memory ran out (OOM or memory guard). Nothing after success; after a
    user's cancel, a failure or another signal, a mode change would not help."""
    if job["status"] in ("succeeded", "queued", "running"):
        return []
    limited = killing_limit(job) and suggested
    choices = [f"a limit of {fmt.gib(suggested)}" if limited else "same settings"]
    if kill_kind(job) in ("oom", "guard"):
        costs = mode_costs()
        cost = costs.get((job.get("spec") or {}).get("mode"))
        if cost is not None:
            choices += [m for m, c in costs.items() if c < cost]
    return choices


LIMIT_REACHED = re.compile(r"limit (\d+(?:\.\d+)?) ?([KMGT]i?B)\b reached")
"""The limit a cgroup OOM kill names (jobs.outcome.kill_reason), for jobs whose spec predates the field."""


def killing_limit(job: dict) -> int | None:
    """The memory limit a job was killed at (OOM in its memory cgroup), or None for any other end."""
    if kill_kind(job) != "oom":
        return None
    limit = (job.get("spec") or {}).get("memory_limit")
    found = LIMIT_REACHED.search(job.get("error") or "")
    if limit is None and found:
        from core.sizes import parse_size

        limit = parse_size(found.group(1) + found.group(2))
    return limit if limit and (found or "memory cgroup" in (job.get("error") or "")) else None


def retry_changes(choice: str, suggested: int | None) -> dict:
    """The spec changes a retry_choices entry stands for."""
    if choice == "same settings":
        return {}
    if choice in mode_costs():
        return {"mode": choice}
    return {"memory_limit": suggested}


def forced_note(job: dict) -> str | None:
    """For a job queued past the submit check (`forced`): that it was, and why the check refused it; a retry
    inherits `forced` from the job it retries, and says so. None for a job that was not forced."""
    spec = job.get("spec") or {}
    if not spec.get("forced"):
        return None
    refusal = (spec.get("forecast") or {}).get("refusal")
    inherited = f" (inherited from job {job['retry_of']}, which this job retries)" if job.get("retry_of") else ""
    if refusal:
        why = re.sub(r"^refused:\s*", "", failure.plain(refusal).rstrip("."))
        return f"Queued anyway{inherited}: the submit check refused it ({why})."
    return f"Queued anyway{inherited}, though the submit check found it fits."


def job_limits(job: dict) -> dict[str, int | None]:
    """The memory bounds the job ran under (bytes or None), as the chart draws them."""
    spec = job.get("spec") or {}
    return {name: spec.get(name) for name in ("memory_limit", "memory_budget", "memory_floor")}


def predicted_peak(job: dict, events=None) -> int | None:
    """Bytes the forecast said the job would add (its predicted peak over the start), when the
    job recorded a forecast: `forecast.predicted_peak_bytes` in its metrics or spec, or the data of
    its `forecast` event (recorded before the first byte is read, so a killed load has it too)."""
    recorded = []
    if events is not None and len(events):
        recorded = [{"forecast": d} for d in events.loc[events["kind"] == "forecast", "data"]]
    for source in (job.get("metrics") or {}, job.get("spec") or {}, *recorded):
        forecast = source.get("forecast")
        if isinstance(forecast, dict) and isinstance(forecast.get("predicted_peak_bytes"), (int, float)):
            return int(forecast["predicted_peak_bytes"])
    return None


def kill_series(job: dict) -> str | None:
    """The chart series whose bound killed the job: cgroup usage at a memory limit, System in use for the memory
    guard (its budget and floor bound it); None for any other end (the chart then fits every curve)."""
    if killing_limit(job):
        return "cgroup usage"
    return "System in use" if kill_kind(job) == "guard" else None
