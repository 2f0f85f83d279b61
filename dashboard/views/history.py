"""The History table and the Compare metrics table, as plain functions of job rows."""

from __future__ import annotations

import datetime as dt

import pandas as pd

from dashboard import format as fmt
from dashboard import words
from dashboard.views import failure
from dashboard.views.cards import seconds_per_step
from dashboard.views.jobs import STATUS_ICONS
from dashboard.views.spec import checkpoint_key, generate_parameters, job_parameters, spec_checkpoint_name, spec_mode
from storage.schema import JOB_STATUSES


def mode_label(mode: str | None) -> str:
    """A placement mode's name after its glyph, the dash Compare draws it with in one character (`Placement.glyph`);
    a mode no longer registered by its name alone."""
    from loader.placement import placement_classes

    glyphs = {cls.name: cls.glyph for cls in placement_classes()}
    if not mode:
        return fmt.MISSING
    return f"{glyphs[mode]} {mode}" if mode in glyphs else mode

FILTERS = {"All": None, **{status.capitalize(): (status,) for status in JOB_STATUSES}}
"""History's status chips: every status has its own, plus All."""


def outcome_text(job: dict) -> str:
    """The status and, for a job that did not succeed, the one-line summary of why (never cut)."""
    error = (job.get("error") or "").strip().splitlines()
    if job["status"] in ("succeeded", "queued", "running") or not error:
        return job["status"]
    return f"{job['status']}: {failure.plain(error[0])}"


def job_summary(samples: pd.DataFrame, mem_total: int | None) -> dict:
    """Peak in use, min headroom, peak footprint (VmRSS + GPU allocated, as a generate's `peak_footprint`) and an
    in-use sparkline (GiB) from a job's downsampled samples; exact for the first two because downsampling keeps
    every bucket's extremes."""
    if samples.empty:
        return {"peak_in_use": None, "min_available": None, "peak_footprint": None, "spark": []}
    first_rank = samples[samples["rank"] == samples["rank"].min()].sort_values("t")
    available = first_rank["mem_available"].astype(float)
    spark = ((mem_total - available) / fmt.GIB).round(3).tolist() if mem_total else (first_rank["vm_rss"] / fmt.GIB).round(3).tolist()
    resident = first_rank["vm_rss"].astype(float) + first_rank["device_allocated"].fillna(0).astype(float)
    return {
        "peak_in_use": mem_total - available.min() if mem_total else None,
        "min_available": available.min(),
        "peak_footprint": resident.max(),
        "spark": spark,
    }


def peak_footprint(job: dict, summary: dict) -> float | None:
    """The job's own peak (VmRSS + GPU allocated): a generate's recorded `peak_footprint`, else from its samples."""
    return (job.get("metrics") or {}).get("peak_footprint") or summary.get("peak_footprint")


def elapsed(job: dict, now: float | None = None) -> float | None:
    """Seconds the job ran: start to end, or to `now` while it runs; None before it starts."""
    if not job.get("started_at"):
        return None
    end = job.get("finished_at") or (now if now is not None and job["status"] == "running" else None)
    return end - job["started_at"] if end else None


def _started(job: dict) -> dt.datetime | None:
    stamp = job.get("started_at") or job.get("created_at")
    return dt.datetime.fromtimestamp(stamp) if stamp else None


INPUT_COLUMNS = dict(words.INPUT_WORDS)
"""History's column per input image (its GenerateParams field -> heading), each cell a thumbnail."""
GENERATE_COLUMNS = ("prompt", "seed", "steps", "frames", "size", "workflow", "VAE tiling", "VAE precision",
                    "transformer weights", "speed levers", "LoRAs")
"""History's columns that generate_parameters fills (empty for a load)."""
HISTORY_COLUMNS = [
    "status", "job", "id", "kind", "mode", "checkpoint", "duration", "peak in use", "peak footprint", "footprint ×",
    "min headroom",
    "in use", "outcome", "started", "device", "dtype", "memory limit", "prompt", "seed", "steps", "frames", "size",
    "workflow", *INPUT_COLUMNS.values(), "VAE tiling", "VAE precision", "transformer weights", "speed levers",
    "LoRAs", "retry of",
]
"""History's columns, in order: what a job cost (duration, peak, footprint) right after what it was, so it is in
view at 1400 px. Numbers stay numeric (so they sort) and get their unit from the page's format."""
STATUS_TINTS = {"failed": "rgba(230, 159, 0, 0.28)", "killed": "rgba(213, 94, 0, 0.28)",
                "interrupted": "rgba(230, 159, 0, 0.16)", "succeeded": "rgba(0, 158, 115, 0.16)"}
"""A status cell's background: colour plus its word (failed amber, killed red, done green), the text
keeping the theme's own colour so it reads in light and dark alike."""


def status_text(status: str) -> str:
    """`✕ killed`: the glyph and the word, never the glyph alone."""
    return f"{STATUS_ICONS.get(status, '?')} {status}"


def status_tint(cell: str) -> str:
    """CSS for a status cell (Styler.map)."""
    word = cell.split(" ", 1)[-1]
    return f"background-color: {STATUS_TINTS[word]}" if word in STATUS_TINTS else ""


def history_frame(jobs: list[dict], summaries: dict[int, dict], *, link,
                  inputs: dict[int, dict[str, str]] | None = None, now: float | None = None) -> pd.DataFrame:
    """One row per job for st.dataframe; `link(job_id)` builds the Job page URL. Memory in GiB,
    durations in seconds (the page's column formats add the units; a running job's is its time so far at `now`).
    `inputs` (job id -> field -> image URL, from the job's own folder) fills the input image columns."""
    rows = []
    for job in jobs:
        summary = summaries.get(job["id"], {})
        metrics = job.get("metrics") or {}
        params = job_parameters(job)
        asked = generate_parameters(job)
        peak = summary.get("peak_in_use")
        rows.append(
            {
                "status": status_text(job["status"]),
                "job": link(job["id"]),
                "id": job["id"],
                "outcome": outcome_text(job),
                "kind": job["kind"],
                "mode": mode_label(spec_mode(job)),
                "checkpoint": spec_checkpoint_name(job),
                "device": params["device"],
                "dtype": params["dtype"],
                "memory limit": params["memory limit"],
                **{column: asked.get(column, "") for column in GENERATE_COLUMNS},
                **{heading: (inputs or {}).get(job["id"], {}).get(field) or "" for field, heading in INPUT_COLUMNS.items()},
                "started": _started(job),
                "duration": elapsed(job, now),
                "peak in use": peak / fmt.GIB if peak is not None else None,
                "peak footprint": (own / fmt.GIB if (own := peak_footprint(job, summary)) is not None else None),
                "footprint ×": metrics.get("footprint_ratio"),
                "min headroom": summary["min_available"] / fmt.GIB if summary.get("min_available") is not None else None,
                "in use": summary.get("spark", []),
                "retry of": link(job["retry_of"]) if job.get("retry_of") else "",
            }
        )
    return pd.DataFrame(rows, columns=HISTORY_COLUMNS)


COMPARE_METRICS = {
    "load": (
        ("footprint_ratio", "footprint"),
        ("host_peak_ratio", "host peak"),
        ("memavailable_cost_ratio", "MemAvailable cost"),
        ("load_seconds", "load time"),
        ("throughput_gbps", "throughput"),
        ("read_efficiency", "read efficiency"),
    ),
    "generate": (
        ("peak_footprint", "peak footprint"),
        ("job_seconds", "job time"),
        ("pass_seconds", "time per pass"),
        ("steps_computed", "passes computed"),
        ("steps_reused", "passes reused"),
    ),
}
"""Figures the Compare table shows per job kind (each with a ratio column against the reference job); a table of
both kinds shows both sets."""
def compare_figures(job: dict, summary: dict) -> dict[str, float | None]:
    """A job's figures by COMPARE_METRICS name: its metrics, and for a generate its peak footprint, its time
    start to end and the denoising stage's seconds per transformer pass."""
    return {**(job.get("metrics") or {}), "peak_footprint": peak_footprint(job, summary), "job_seconds": elapsed(job),
            "pass_seconds": seconds_per_step(job, None, 0.0)}


def comparison_table(jobs: list[dict], summaries: dict[int, dict], reference_id: int) -> pd.DataFrame:
    """Rows = jobs; columns = the outcome, peak in use, min headroom and each figure of the jobs' kinds with its
    ratio to the reference job ("0.50×"), then every parameter (job_parameters). A ratio is given only against a
    job of the same checkpoint, component and kind: "different checkpoint" otherwise."""
    ref = next((j for j in jobs if j["id"] == reference_id), None)
    if ref is None:
        raise ValueError(f"reference job {reference_id} is not among the compared jobs {[j['id'] for j in jobs]}")
    ref_figures = compare_figures(ref, summaries.get(reference_id, {}))
    shown = [m for kind in COMPARE_METRICS if any(j["kind"] == kind for j in jobs) for m in COMPARE_METRICS[kind]]
    rows = []
    for job in jobs:
        figures = compare_figures(job, summaries.get(job["id"], {}))
        summary = summaries.get(job["id"], {})
        comparable = checkpoint_key(job) == checkpoint_key(ref)
        row = {"job": f"#{job['id']}" + (" (ref)" if job["id"] == reference_id else ""), "outcome": job["status"]}
        row["peak in use"] = fmt.gib(summary.get("peak_in_use"))
        row["min headroom"] = fmt.gib(summary.get("min_available"))
        for name, label in shown:
            value = figures.get(name)
            row[label] = fmt.metric_value(name, value) if value is not None else fmt.MISSING
            base = ref_figures.get(name)
            if not comparable:
                row[f"{label} vs ref"] = "different checkpoint"
            else:
                row[f"{label} vs ref"] = fmt.ratio(value / base) if value is not None and base else fmt.MISSING
        row.update(job_parameters(job))  # after the figures, which are what a comparison is for (in view at 1024 px)
        rows.append(row)
    return pd.DataFrame(rows).fillna(fmt.MISSING)  # a load has no prompt: "—", never a blank read as None


def default_comparison(jobs: list[dict], limit: int) -> list[int]:
    """What Compare shows when nothing is chosen: the newest succeeded job of each mode, all of
    one checkpoint, component and kind (those of the newest succeeded job), oldest first."""
    done = [j for j in jobs if j["status"] == "succeeded" and spec_mode(j)]
    if not done:
        return []
    key = checkpoint_key(max(done, key=lambda j: j["id"]))
    latest: dict[str, int] = {}
    for job in sorted(done, key=lambda j: -j["id"]):
        if checkpoint_key(job) == key and spec_mode(job) not in latest:
            latest[spec_mode(job)] = job["id"]
    return sorted(latest.values())[:limit]


def checkpoints_of(jobs: list[dict]) -> list[str]:
    """The distinct checkpoints (name/component, kind) among `jobs`, in order: more than one means
    the comparison mixes checkpoints."""
    return list(dict.fromkeys(f"{spec_checkpoint_name(j)} ({j['kind']})" for j in jobs))


def diff_only(table: pd.DataFrame, keep: tuple[str, ...] = ("job",)) -> pd.DataFrame:
    """Only the columns whose values differ between rows (and `keep`), like W&B's Diff only."""
    varying = [c for c in table.columns if c in keep or table[c].astype(str).nunique() > 1]
    return table[varying]
