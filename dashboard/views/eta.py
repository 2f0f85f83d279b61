"""Seconds per stage as the forecast stored on a job at submit predicted them: the Run page's duration
table, the Job page's time left while a generate runs and its predicted-vs-measured table at the end."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from models.eta import NO_HISTORY, StageEta, time_left, total_seconds


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
    return [{"stage": e.stage, "predicted": seconds_text(e.seconds), "basis": e.basis} for e in stage_etas(forecast)]


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


def predicted_vs_measured(forecast: Mapping[str, Any] | None, measured: Mapping[str, float]) -> list[dict[str, Any]]:
    """Per predicted stage: predicted and measured seconds, and measured / predicted."""
    rows = []
    for e in stage_etas(forecast):
        took = measured.get(e.stage)
        ratio = took / e.seconds if took is not None and e.seconds else None
        rows.append({"stage": e.stage, "predicted": seconds_text(e.seconds), "measured": seconds_text(took),
                     "measured / predicted": "-" if ratio is None else f"{ratio:.2f}"})
    return rows


def stage_progress(events: Iterable[Mapping[str, Any]], now: float) -> tuple[list[str], str | None, float]:
    """From a job's events (kind, stage, created_at): the stages ended, the one running, and its elapsed seconds."""
    done, current, started = [], None, now
    for e in events:
        if e["kind"] == "stage_start":
            current, started = e["stage"], e["created_at"]
        elif e["kind"] == "stage_end":
            done.append(e["stage"])
            current = None if e["stage"] == current else current
    return done, current, (now - started) if current is not None else 0.0
