"""The History table and the Compare metrics table, as plain functions of job rows."""

from __future__ import annotations

import datetime as dt

import pandas as pd

from dashboard import format as fmt
from dashboard.views.jobs import STATUS_ICONS
from dashboard.views.spec import spec_checkpoint_name, spec_mode

MODE_GLYPHS = {"retain": "━ retain", "drain": "╍ drain", "stream": "┈ stream"}
"""Mode labels with the dash glyph the Compare page draws them with."""

FILTERS = {
    "All": None,
    "Running": ("queued", "running"),
    "Completed": ("succeeded",),
    "Failed": ("failed", "interrupted", "cancelled"),
    "Killed": ("killed",),
}
"""History's status tabs and the statuses each shows."""


def job_summary(samples: pd.DataFrame, mem_total: int | None) -> dict:
    """Peak in use, min headroom and an in-use sparkline (GiB) from a job's
    downsampled samples; exact because downsampling keeps every bucket's min."""
    if samples.empty:
        return {"peak_in_use": None, "min_available": None, "spark": []}
    first_rank = samples[samples["rank"] == samples["rank"].min()].sort_values("t")
    available = first_rank["mem_available"].astype(float)
    spark = ((mem_total - available) / fmt.GIB).round(3).tolist() if mem_total else (first_rank["vm_rss"] / fmt.GIB).round(3).tolist()
    return {
        "peak_in_use": mem_total - available.min() if mem_total else None,
        "min_available": available.min(),
        "spark": spark,
    }


def _started(job: dict) -> dt.datetime | None:
    stamp = job.get("started_at") or job.get("created_at")
    return dt.datetime.fromtimestamp(stamp) if stamp else None


def _duration(job: dict) -> float | None:
    if job.get("started_at") and job.get("finished_at"):
        return job["finished_at"] - job["started_at"]
    return None


def history_frame(jobs: list[dict], summaries: dict[int, dict], *, link) -> pd.DataFrame:
    """One row per job for st.dataframe; `link(job_id)` builds the Job page URL."""
    rows = []
    for job in jobs:
        summary = summaries.get(job["id"], {})
        metrics = job.get("metrics") or {}
        peak = summary.get("peak_in_use")
        rows.append(
            {
                "": STATUS_ICONS.get(job["status"], "?"),
                "job": link(job["id"]),
                "id": job["id"],
                "kind": job["kind"],
                "mode": MODE_GLYPHS.get(spec_mode(job), spec_mode(job) or fmt.MISSING),
                "checkpoint": spec_checkpoint_name(job),
                "started": _started(job),
                "duration (s)": _duration(job),
                "peak in use (GiB)": peak / fmt.GIB if peak is not None else None,
                "footprint ×": metrics.get("footprint_ratio"),
                "min headroom (GiB)": summary["min_available"] / fmt.GIB if summary.get("min_available") is not None else None,
                "in use": summary.get("spark", []),
                "outcome": job["status"] if job["status"] != "failed" else f"failed: {(job.get('error') or '').splitlines()[0] if job.get('error') else ''}",
            }
        )
    columns = ["", "job", "id", "kind", "mode", "checkpoint", "started", "duration (s)", "peak in use (GiB)", "footprint ×", "min headroom (GiB)", "in use", "outcome"]
    return pd.DataFrame(rows, columns=columns)


COMPARE_METRICS = (
    ("footprint_ratio", "footprint"),
    ("host_peak_ratio", "host peak"),
    ("memavailable_cost_ratio", "MemAvailable cost"),
    ("load_seconds", "load time"),
    ("throughput_gbps", "throughput"),
    ("read_efficiency", "read efficiency"),
)
"""Metrics the Compare table shows, with a ratio column against the reference job."""


def comparison_table(jobs: list[dict], summaries: dict[int, dict], reference_id: int) -> pd.DataFrame:
    """Rows = jobs, columns = what differs between them plus each metric and its
    ratio to the reference job ("0.50× ref")."""
    ref = next((j for j in jobs if j["id"] == reference_id), None)
    if ref is None:
        raise ValueError(f"reference job {reference_id} is not among the compared jobs {[j['id'] for j in jobs]}")
    ref_metrics = ref.get("metrics") or {}
    rows = []
    for job in jobs:
        metrics = job.get("metrics") or {}
        summary = summaries.get(job["id"], {})
        row = {
            "job": f"#{job['id']}" + (" (ref)" if job["id"] == reference_id else ""),
            "kind": job["kind"],
            "mode": spec_mode(job) or fmt.MISSING,
            "checkpoint": spec_checkpoint_name(job),
            "device": (job.get("spec") or {}).get("device", fmt.MISSING),
            "outcome": job["status"],
            "peak in use": fmt.gib(summary.get("peak_in_use")),
            "min headroom": fmt.gib(summary.get("min_available")),
        }
        for name, label in COMPARE_METRICS:
            value = metrics.get(name)
            row[label] = fmt.metric_value(name, value) if value is not None else fmt.MISSING
            base = ref_metrics.get(name)
            row[f"{label} vs ref"] = fmt.ratio(value / base) if value is not None and base else fmt.MISSING
        rows.append(row)
    return pd.DataFrame(rows)


def diff_only(table: pd.DataFrame, keep: tuple[str, ...] = ("job",)) -> pd.DataFrame:
    """Only the columns whose values differ between rows (and `keep`), like W&B's Diff only."""
    varying = [c for c in table.columns if c in keep or table[c].astype(str).nunique() > 1]
    return table[varying]
