"""Where a job is, as plain functions of its row and samples: its status, progress, live figures, stall and
the one line the header, status box and queue chip quote.

No Streamlit here: the page draws what these return, and tests call them
directly with made-up rows. What a finished job's banner says is in
`views.outcome`, the metric row in `views.cards`, the tables in `views.job_tables`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from dashboard import format as fmt
from dashboard.views import failure
from jobs.stage_words import COUNTED_STAGES, progress_text
from storage.schema import FINAL_STATUSES


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
    """True once nothing about the job changes any more (the live timer stops)."""
    return job["status"] in FINAL_STATUSES


def status_state(status: str) -> str:
    """st.status's state for a job status: running, complete or error. A user's
    cancel is complete, not an error: nothing went wrong."""
    if status in ("queued", "running"):
        return "running"
    return "complete" if status in ("succeeded", "cancelled") else "error"


@dataclass(frozen=True)
class Progress:
    """Where a job is by its own row: the one reading the header, status line,
    queue chip and cards all quote, so they never disagree."""

    stage: str | None
    """The stage the job last reported."""
    done: int | None
    """Tensors placed (loads) or denoising steps done (generate)."""
    total: int | None
    """Of how many; None before the job knows."""

    @property
    def text(self) -> str:
        """`loading 13/41`, `denoising 1/2`, or just the stage, in words (jobs.stage_words.progress_text)."""
        return progress_text(self.stage, self.done, self.total)

    @property
    def fraction(self) -> float | None:
        """Of the counted stage only: a later stage has no share of the passes."""
        return min(1.0, (self.done or 0) / self.total) if self.total and self.stage in COUNTED_STAGES else None


def progress(job: dict) -> Progress:
    return Progress(job.get("stage"), job.get("progress_done"), job.get("progress_total"))


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
    """Max ((VmRSS − first VmRSS) + (device − first device)) / bytes placed: the load report's footprint_ratio so far."""
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


STALL_AFTER = 30.0
"""Seconds without a new sample after which a running job is called stalled. A load records a sample per
tensor and a generate several a second; a child stopped (SIGSTOP) or wedged records none, while its heartbeat,
which the supervisor writes, stays fresh."""


def stalled_for(job: dict, stats: LiveStats, events: pd.DataFrame, *, now: float | None = None) -> float | None:
    """Seconds since a running job's last sample when over `STALL_AFTER`, else None.

    The sample's time is on the child's clock (`t` from its start); any event's `created_at - t` puts that
    start on the wall clock.
    """
    if job["status"] != "running" or not stats.samples or not len(events):
        return None
    start = float((events["created_at"] - events["t"]).iloc[0])
    age = (time.time() if now is None else now) - (start + stats.elapsed)
    return age if age > STALL_AFTER else None


def status_label(job: dict, stats: LiveStats, total_bytes: int | None, *, now: float | None = None,
                 stalled: float | None = None) -> str:
    """One line saying where the job is, e.g. "Killed (SIGKILL) at 81% placed (79.7 GiB) · t = 412 s";
    `stalled` (from `stalled_for`) adds "stalled: no progress for N s" to a running job's line."""
    status = job["status"]
    if total_bytes:
        where = f"{fmt.percent(stats.bytes_placed / total_bytes)} placed ({fmt.gib(stats.bytes_placed)})"
    else:
        where = f"{fmt.gib(stats.bytes_placed)} placed"
    at = f"{where} · t = {fmt.duration(stats.elapsed)}" if job.get("kind", "load") == "load" else f"t = {fmt.duration(stats.elapsed)}"
    if status == "queued":
        return "Queued: waiting for the worker"
    if status == "running":
        started = job.get("started_at")
        waited = (now or time.time()) - started if started else stats.elapsed
        if not stats.samples or job.get("stage") in STARTING_STAGES:
            return f"{starting_text(job)} · {fmt.duration(waited)}"
        # sparse timer samples in a generate: the clock, not the last sample's t
        line = f"{progress(job).text or 'running'} · {fmt.duration(waited) if job.get('kind', 'load') != 'load' else at}"
        return line if stalled is None else f"{line} · stalled: no progress for {stalled:.0f} s"
    if status == "succeeded":
        took = _took(job)
        return f"Done in {fmt.duration(took)}" if took is not None else "Done"
    if status == "killed":
        signal = f" ({job['signal']})" if job.get("signal") else ""
        by = {"oom": " by the OOM killer", "guard": " by the memory guard"}.get(kill_kind(job), "")
        return f"Killed{signal}{by} at {at}"
    if status == "cancelled":
        return f"Cancelled by the user at {at}"
    if status == "interrupted":
        return f"Interrupted (the worker stopped) at {at}"
    error = failure.plain((job.get("error") or "no error message recorded").splitlines()[0])
    return f"Failed at {at}: {error}"


def startup_text(samples: pd.DataFrame) -> str | None:
    """What a load's process did before its first tensor (`samples` in time order, first rank): its seconds and
    VmRSS then, said apart from the chart, which starts at the first placement as the footprint ratio does;
    None when no sample came before it."""
    part = samples[samples["rank"] == samples["rank"].min()] if "rank" in samples and len(samples) else samples
    part = part.sort_values("t") if len(part) else part
    placing = part["bytes_placed"].notna().to_numpy() if len(part) else []
    if not len(part) or not placing.any() or placing[0]:
        return None
    first = part.iloc[int(placing.argmax())]
    return (f"Before its first tensor the job's process started up for {fmt.duration(first['t'] - part['t'].iloc[0])}"
            f" (importing, opening the checkpoint; VmRSS {fmt.gib(part['vm_rss'].iloc[0])} → "
            f"{fmt.gib(first['vm_rss'])}): the chart starts at the first tensor, as the footprint ratio does.")


STARTING_STAGES = frozenset({None, "probe", "prepare"})
"""Stages before a job does its own work: the page says what is happening instead of the stage's name."""


def starting_text(job: dict) -> str:
    """What a job that has not started its own work is doing, in order."""
    if job.get("kind", "load") == "load":
        return "Starting the job: importing, opening the checkpoint…"
    if job.get("stage") == "prepare":
        return "Starting the job: preparing the tokenizer and scheduler, then loading the text encoder…"
    return "Starting the job: importing the pipeline, then loading the text encoder…"


def kill_kind(job: dict) -> str | None:
    """Who ended a killed job: "guard" (the supervisor's memory guard), "oom" (the kernel's
    OOM killer, confirmed or most likely) or "signal" (something else); None if not killed."""
    if job["status"] != "killed":
        return None
    error = (job.get("error") or "").lower()
    if "memory guard" in error:
        return "guard"
    if "oom" in error:
        return "oom"
    return "signal"


def _took(job: dict) -> float | None:
    if job.get("started_at") and job.get("finished_at"):
        return job["finished_at"] - job["started_at"]
    return None


def describe_supervisor(status: dict) -> str:
    """`alive (pid 4242, running job 7)` or `not running`."""
    if not status.get("alive"):
        return "not running"
    doing = f", running job {status['current_job']}" if status.get("current_job") else ", idle"
    return f"alive (pid {status['pid']}{doing})"


def queue_places(active: list[dict]) -> dict[int, str]:
    """Job id -> where a queued job stands, for jobs in data.active_jobs' order (running first, then the queue):
    "next in the queue, behind job 7 (running)" or "3rd in the queue, behind job 7 (running) and jobs 9, 11"."""
    running = [j["id"] for j in active if j["status"] == "running"]
    queued = [j["id"] for j in active if j["status"] == "queued"]
    places = {}
    for position, job_id in enumerate(queued):
        ahead = [f"job {i} (running)" for i in running]
        if position:
            before = queued[:position]
            ahead.append(("job " if len(before) == 1 else "jobs ") + ", ".join(map(str, before)))
        where = "next in the queue" if position == 0 else f"{_ordinal(position + 1)} in the queue"
        places[job_id] = f"{where}, behind {' and '.join(ahead)}" if ahead else f"{where}: it starts when a worker is free"
    return places


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def queue_chip(jobs: list[dict]) -> str:
    """"▶ 1 running: job 7 (load 310/639) · 2 queued" for the frame."""
    running = [j for j in jobs if j["status"] == "running"]
    queued = [j for j in jobs if j["status"] == "queued"]
    if not running and not queued:
        return "Idle: nothing running or queued"
    parts = []
    if running:
        job = running[0]
        text = progress(job).text
        parts.append(f"▶ {len(running)} running: job {job['id']}" + (f" ({text})" if text else ""))
    if queued:
        parts.append(f"{len(queued)} queued")
    return " · ".join(parts)
