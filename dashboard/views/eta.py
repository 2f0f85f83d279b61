"""Seconds per stage as the forecast stored on a job at submit predicted them: the Run page's duration
table, the Job page's time left while a generate runs and its predicted-vs-measured table at the end."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from dashboard import words
from models.forecast.eta import NO_HISTORY, StageEta, time_left, total_seconds
from models.speed.levers import INTERLUDES


def stage_etas(forecast: Mapping[str, Any] | None) -> list[StageEta]:
    """The StageEta list a stored forecast carries (empty without one)."""
    return [StageEta(e["stage"], e.get("seconds"), e.get("basis", NO_HISTORY))
            for e in (forecast or {}).get("eta") or []]


def seconds_text(seconds: float | None) -> str:
    """"42 s", "3 min 5 s", or "-" for no estimate."""
    if seconds is None:
        return "-"
    whole = round(seconds)
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60} s"


def duration_rows(forecast: Mapping[str, Any] | None) -> list[dict[str, str]]:
    """One row per stage for the Run page: predicted seconds and where they come from."""
    return [{"stage": words.stage(e.stage), "predicted": seconds_text(e.seconds), "basis": e.basis}
            for e in stage_etas(forecast)]


def duration_summary(forecast: Mapping[str, Any] | None) -> str:
    """One line: the predicted total, or why there is none."""
    etas = stage_etas(forecast)
    total = total_seconds(etas)
    if total is not None:
        return f"Predicted duration {seconds_text(total)} (this machine's past runs, scaled by tokens, pixels and steps)."
    missing = sum(e.seconds is None for e in etas)
    return f"Predicted duration unknown: {NO_HISTORY} for {missing} of {len(etas)} stages."


def time_left_text(forecast: Mapping[str, Any] | None, done: Iterable[str], current: str | None, elapsed: float,
                   step_share: float | None = None) -> str:
    """"About 1 min 20 s left" while a job runs, or why it cannot be said."""
    etas = stage_etas(forecast)
    if not etas:
        return "Time left unknown: the job recorded no forecast."
    left = time_left(etas, done, current, elapsed, step_share)
    return f"Time left unknown: {NO_HISTORY} for some stage." if left is None else f"About {seconds_text(left)} left."


def predicted_vs_measured(forecast: Mapping[str, Any] | None, measured: Mapping[str, float],
                          job_seconds: float | None = None) -> list[dict[str, Any]]:
    """Per predicted stage (in words): predicted and measured seconds, and measured / predicted; then the stages
    no forecast covers, the rest of the job's time (the process starting, imports, the gaps between stages) and
    the total, so the measured column adds up to `job_seconds` (start to end) when it is given."""
    def row(stage: str, predicted: float | None, took: float | None) -> dict[str, Any]:
        ratio = took / predicted if took is not None and predicted else None
        return {"stage": stage, "predicted": seconds_text(predicted), "measured": seconds_text(took),
                "measured / predicted": "-" if ratio is None else f"{ratio:.2f}"}

    etas = stage_etas(forecast)
    rows = [row(words.stage(e.stage), e.seconds, measured.get(e.stage)) for e in etas]
    if job_seconds is None:
        return rows
    forecast_stages = {e.stage for e in etas}
    others = {k: v for k, v in measured.items() if k not in forecast_stages}
    if others:
        rows.append(row("other stages (" + ", ".join(dict.fromkeys(words.stage(k) for k in others)) + ")", None,
                        sum(others.values())))
    rows.append(row("the rest: starting the process, imports, between stages", None,
                    max(0.0, job_seconds - sum(measured.values()))))
    rows.append(row("total", total_seconds(etas), job_seconds))
    return rows


def stage_progress(events: Iterable[Mapping[str, Any]], now: float) -> tuple[list[str], str | None, float]:
    """From a job's events (kind, stage, created_at): the stages ended, the one running, and its elapsed seconds. A
    stage that starts again is not done, nor is the one a running interlude was cut from (a compile's first calls
    out of `denoise.denoise` or `decode.video`, `models.speed.levers.INTERLUDES`): both go on, and their time is to come."""
    done, current, started = [], None, now
    for e in events:
        if e["kind"] == "stage_start":
            current, started = e["stage"], e["created_at"]
            done = [s for s in done if s not in (current, INTERLUDES.get(current))]
        elif e["kind"] == "stage_end":
            done.append(e["stage"])
            current = None if e["stage"] == current else current
    return done, current, (now - started) if current is not None else 0.0
