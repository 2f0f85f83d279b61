"""What the Job page says about a job, as plain functions of its row and samples.

No Streamlit here: the page draws what these return, and tests call them
directly with made-up rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from dashboard import format as fmt

FINAL = frozenset({"succeeded", "failed", "killed", "cancelled", "interrupted"})
"""Statuses after which nothing changes (the live timer stops)."""

STATUS_ICONS = {
    "queued": "○",
    "running": "▶",
    "succeeded": "✓",
    "failed": "✗",
    "killed": "✕",
    "cancelled": "■",
    "interrupted": "!",
}
"""One glyph per status, shared by History and the queue chip."""


def is_final(job: dict) -> bool:
    return job["status"] in FINAL


def status_state(status: str) -> str:
    """st.status's state for a job status: running, complete or error."""
    if status in ("queued", "running"):
        return "running"
    return "complete" if status == "succeeded" else "error"


@dataclass(frozen=True)
class LiveStats:
    """Figures read off a job's samples so far (bytes and seconds)."""

    samples: int
    """Rows the figures come from (possibly downsampled; peaks are kept)."""
    bytes_placed: int
    """Bytes placed at the last sample."""
    elapsed: float
    """Seconds since job start at the last sample."""
    throughput: float | None
    """Bytes per second placed, over the span where placement happened."""
    peak_in_use: int | None
    """Max of MemTotal − MemAvailable (None when MemTotal is unknown)."""
    min_available: int | None
    """Lowest MemAvailable (the least headroom)."""
    peak_rss: int | None
    """Max VmRSS of the worker."""
    peak_device: int | None
    """Max device allocated; None when nothing was allocated on a device."""
    footprint: float | None
    """Max ((VmRSS − first VmRSS) + (device − first device)) / bytes placed: DESIGN's footprint_ratio so far."""
    peak_resident: int | None = None
    """Max of VmRSS + device allocated: a generate job's peak footprint so far."""
    peak_resident_stage: str | None = None
    """The stage that sample was taken in."""


def live_stats(samples: pd.DataFrame, mem_total: int | None) -> LiveStats:
    """LiveStats of rank 0 (or the only rank); empty samples give zeros and Nones."""
    if samples.empty:
        return LiveStats(0, 0, 0.0, None, None, None, None, None, None)
    part = samples[samples["rank"] == samples["rank"].min()] if "rank" in samples else samples
    part = part.sort_values("t")
    placed = part["bytes_placed"].fillna(0).astype(float)
    moving = part[placed.diff().fillna(placed) > 0]
    throughput = None
    if len(moving) >= 2 and moving["t"].iloc[-1] > moving["t"].iloc[0]:
        throughput = (placed.max() - placed[moving.index[0]]) / (moving["t"].iloc[-1] - moving["t"].iloc[0])
    rss = part["vm_rss"].astype(float)
    device = part["device_allocated"].fillna(0).astype(float)
    grown = (rss - rss.iloc[0]) + (device - device.iloc[0])
    with_bytes = placed > 0
    footprint = float((grown[with_bytes] / placed[with_bytes]).max()) if with_bytes.any() else None
    min_available = int(part["mem_available"].min())
    resident = rss + device
    at_peak = resident.idxmax()
    return LiveStats(
        samples=len(part),
        bytes_placed=int(placed.iloc[-1]),
        elapsed=float(part["t"].iloc[-1]),
        throughput=throughput,
        peak_in_use=int(mem_total - min_available) if mem_total else None,
        min_available=min_available,
        peak_rss=int(rss.max()),
        peak_device=int(device.max()) if device.max() > 0 else None,
        footprint=footprint,
        peak_resident=int(resident[at_peak]),
        peak_resident_stage=str(part.at[at_peak, "stage"]) if pd.notna(part.at[at_peak, "stage"]) else None,
    )


def status_label(job: dict, stats: LiveStats, total_bytes: int | None, *, now: float | None = None) -> str:
    """One line saying where the job is, e.g. "Killed (SIGKILL) at 81% placed (79.7 GiB) · t = 412 s"."""
    status = job["status"]
    where = fmt.gib(stats.bytes_placed)
    if total_bytes:
        where = f"{fmt.percent(stats.bytes_placed / total_bytes)} placed ({fmt.gib(stats.bytes_placed)})"
    else:
        where = f"{fmt.gib(stats.bytes_placed)} placed"
    at = f"{where} · t = {fmt.duration(stats.elapsed)}" if job.get("kind", "load") == "load" else f"t = {fmt.duration(stats.elapsed)}"
    if status == "queued":
        return "Queued: waiting for the worker"
    if status == "running":
        started = job.get("started_at")
        if not stats.samples:
            waited = (now or time.time()) - started if started else 0.0
            return f"Starting worker, importing, opening checkpoint… {fmt.duration(waited)}"
        stage = job.get("stage") or "running"
        progress = ""
        if job.get("progress_total"):
            progress = f" {job.get('progress_done') or 0}/{job['progress_total']}"
        return f"{stage}{progress} · {at}"
    if status == "succeeded":
        took = _took(job)
        return f"Done in {fmt.duration(took)}" if took is not None else "Done"
    if status == "killed":
        signal = job.get("signal") or "a signal"
        return f"Killed ({signal}) at {at}"
    if status == "cancelled":
        return f"Cancelled at {at}"
    if status == "interrupted":
        return f"Interrupted (the worker stopped) at {at}"
    error = (job.get("error") or "no error message recorded").splitlines()[0]
    return f"Failed at {at}: {error}"


def _took(job: dict) -> float | None:
    if job.get("started_at") and job.get("finished_at"):
        return job["finished_at"] - job["started_at"]
    return None


@dataclass(frozen=True)
class Card:
    """One st.metric card."""

    label: str
    value: str
    delta: str | None = None
    delta_color: str = "normal"
    help: str | None = None


def metric_cards(
    job: dict,
    stats: LiveStats,
    *,
    total_bytes: int | None,
    capacity: int | None,
    previous: dict | None = None,
    events: pd.DataFrame | None = None,
) -> list[Card]:
    """The Job page's metric row (at most five cards): a load's placement and
    footprint ratio, or a generate job's steps and peak footprint.

    `previous` is the last finished job with the same mode: a load's footprint
    card's delta compares against it (lower is better). `events` (t, kind,
    stage) lets a running generate job's s/step be measured from when
    denoising started.
    """
    if job.get("kind", "load") != "load":
        return _generate_cards(job, stats, capacity=capacity, events=events)
    killed = job["status"] in ("killed", "failed", "cancelled", "interrupted")
    rate = f"{stats.throughput / fmt.GIB:.2f} GiB/s" if stats.throughput else None
    delta = rate
    if total_bytes:
        delta = f"{fmt.percent(stats.bytes_placed / total_bytes)} of {fmt.gib(total_bytes)}" + (f" · {rate}" if rate else "")
    cards = [
        Card(
            "Placed",
            fmt.gib(stats.bytes_placed),
            delta=delta,
            delta_color="off",
            help="bytes_placed: destination bytes written, in the target dtype",
        ),
        _peak_in_use_card(stats),
    ]
    metrics = job.get("metrics") or {}
    footprint = metrics.get("footprint_ratio", stats.footprint)
    value = fmt.ratio(footprint)
    if killed and "footprint_ratio" not in metrics:
        value = f"{fmt.ratio(stats.footprint)} (so far)" if stats.footprint else f"{fmt.MISSING} (killed)"
    delta = None
    prev_ratio = ((previous or {}).get("metrics") or {}).get("footprint_ratio")
    if footprint is not None and prev_ratio is not None:
        delta = f"{footprint - prev_ratio:+.2f}× vs job {previous['id']}"
    cards.append(
        Card(
            "Footprint ratio",
            value,
            delta=delta,
            delta_color="inverse",
            help="footprint_ratio: max over samples of (VmRSS growth + device allocated growth) / bytes placed; 1.0× is the model itself",
        )
    )
    cards.append(_headroom_card(stats, capacity))
    if stats.peak_device is not None:
        cards.append(Card("Peak GPU allocated", fmt.gib(stats.peak_device), help="torch.cuda.memory_allocated"))
    else:
        cards.append(_peak_rss_card(stats))
    return cards


def _peak_in_use_card(stats: LiveStats) -> Card:
    return Card(
        "Peak system in use",
        fmt.gib(stats.peak_in_use),
        help="max of MemTotal − MemAvailable over the job (/proc/meminfo); the whole machine, not just this job",
    )


def _headroom_card(stats: LiveStats, capacity: int | None) -> Card:
    low = capacity is not None and stats.min_available is not None and stats.min_available < 0.1 * capacity
    return Card(
        "Min headroom",
        fmt.gib(stats.min_available),
        delta="under 10% of capacity" if low else None,
        delta_color="inverse" if low else "off",
        help="lowest MemAvailable seen (/proc/meminfo)",
    )


def _peak_rss_card(stats: LiveStats) -> Card:
    return Card("Peak VmRSS", fmt.gib(stats.peak_rss), help="max resident set of the worker (/proc status)")


def seconds_per_step(job: dict, events: pd.DataFrame | None, elapsed: float) -> float | None:
    """Seconds per denoising step: the denoising stage's time (finished: from the
    metrics; running: from its stage_start event to `elapsed`) over the steps done.
    The stage also loads the DiT, so early steps read a little slow."""
    done = job.get("progress_done") or 0
    if not done:
        return None
    seconds = ((job.get("metrics") or {}).get("stage_seconds") or {}).get("denoising")
    if seconds is None and events is not None and len(events):
        started = events[(events["kind"] == "stage_start") & (events["stage"] == "denoising")]
        if len(started):
            seconds = elapsed - float(started["t"].iloc[0])
    return seconds / done if seconds and seconds > 0 else None


def _generate_cards(job: dict, stats: LiveStats, *, capacity: int | None, events: pd.DataFrame | None) -> list[Card]:
    """Steps k/N with s/step, peak system in use, peak footprint (and the stage it
    happened in), min headroom and peak VmRSS: bytes placed say little here, since
    components load and leave stage by stage."""
    done, total = job.get("progress_done"), job.get("progress_total")
    per_step = seconds_per_step(job, events, stats.elapsed)
    metrics = job.get("metrics") or {}
    stage_peaks = {k: v for k, v in (metrics.get("stage_peaks") or {}).items() if isinstance(v, (int, float))}
    peak = metrics.get("peak_footprint") or stats.peak_resident
    peak_stage = max(stage_peaks, key=stage_peaks.get) if stage_peaks else stats.peak_resident_stage
    by_stage = " · ".join(f"{stage} {fmt.gib(value, 2)}" for stage, value in stage_peaks.items())
    return [
        Card(
            "Denoising steps",
            f"{done or 0}/{total}" if total else fmt.MISSING,
            delta=f"{per_step:.2f} s/step" if per_step else None,
            delta_color="off",
            help="denoising steps done of the total; s/step is the denoising stage's time (DiT load included) over the steps done",
        ),
        _peak_in_use_card(stats),
        Card(
            "Peak footprint",
            fmt.gib(peak, 2),
            delta=f"in {peak_stage}" if peak_stage else None,
            delta_color="off",
            help="peak_footprint: max over the stages of VmRSS + GPU allocated"
            + (f" (stage_peaks: {by_stage})" if by_stage else " (so far, from the samples)"),
        ),
        _headroom_card(stats, capacity),
        _peak_rss_card(stats),
    ]


def metrics_table(metrics: dict | None) -> pd.DataFrame:
    """The job's final metrics, DESIGN.md names kept beside readable labels and values."""
    rows = [
        {"metric": fmt.metric_label(name), "value": fmt.metric_value(name, value), "name": name}
        for name, value in (metrics or {}).items()
        if isinstance(value, (int, float, str, type(None))) and not isinstance(value, bool)
    ]
    return pd.DataFrame(rows, columns=["metric", "value", "name"])


def event_table(events: pd.DataFrame, *, last: int | None = None) -> pd.DataFrame:
    """Events as (t, kind, stage, message) rows, newest last; `last` keeps only the final ones."""
    if events.empty:
        return pd.DataFrame(columns=["t", "kind", "stage", "message"])
    table = events[["t", "kind", "stage", "message"]]
    return (table.tail(last) if last else table).reset_index(drop=True)


def last_sample_table(sample: dict | None, mem_total: int | None) -> pd.DataFrame:
    """The last sample as readable (field, value) rows: what a killed job looked like at the end."""
    if not sample:
        return pd.DataFrame(columns=["field", "value"])
    rows = [
        ("t", fmt.duration(sample.get("t"))),
        ("stage", sample.get("stage") or fmt.MISSING),
        ("tensor", sample.get("tensor_name") or fmt.MISSING),
        ("tensors placed", f"{sample.get('tensors_placed') or 0:,}"),
        ("bytes placed", fmt.gib(sample.get("bytes_placed"), 2)),
        ("VmRSS", fmt.gib(sample.get("vm_rss"), 2)),
        ("RssFile", fmt.gib(sample.get("rss_file"), 2)),
        ("RssAnon", fmt.gib(sample.get("rss_anon"), 2)),
        ("MemAvailable", fmt.gib(sample.get("mem_available"), 2)),
    ]
    if mem_total and sample.get("mem_available") is not None:
        rows.append(("System in use", fmt.gib(mem_total - sample["mem_available"], 2)))
    if sample.get("device_allocated"):
        rows.append(("GPU allocated", fmt.gib(sample["device_allocated"], 2)))
    return pd.DataFrame(rows, columns=["field", "value"])


def describe_supervisor(status: dict) -> str:
    """`alive (pid 4242, running job 7)` or `not running`."""
    if not status.get("alive"):
        return "not running"
    doing = f", running job {status['current_job']}" if status.get("current_job") else ", idle"
    return f"alive (pid {status['pid']}{doing})"


def queue_chip(jobs: list[dict]) -> str:
    """"▶ 1 running: job 7 (load 310/639) · 2 queued" for the frame."""
    running = [j for j in jobs if j["status"] == "running"]
    queued = [j for j in jobs if j["status"] == "queued"]
    if not running and not queued:
        return "Idle: nothing running or queued"
    parts = []
    if running:
        job = running[0]
        detail = ""
        if job.get("progress_total"):
            detail = f" ({job.get('stage') or 'step'} {job.get('progress_done') or 0}/{job['progress_total']})"
        parts.append(f"▶ {len(running)} running: job {job['id']}{detail}")
    if queued:
        parts.append(f"{len(queued)} queued")
    return " · ".join(parts)
