"""The Job page's metric row as plain functions: a load's placement and footprint, a generate's passes and peak."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from dashboard import format as fmt
from dashboard import words
from dashboard.views.jobs import LiveStats, progress
from models.speed.levers import COMPILE_CALLS, COMPILE_STAGE
from storage.schema import FINAL_STATUSES


@dataclass(frozen=True)
class Card:
    """One st.metric card."""

    label: str
    value: str
    delta: str | None = None
    delta_color: str = "normal"
    help: str | None = None

    @property
    def delta_arrow(self) -> str:
        """No trend arrow on a neutral delta (progress, a rate, where a peak happened): only a real change gets one."""
        return "off" if self.delta_color == "off" else "auto"


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

    `previous` is the last finished job of the same checkpoint, component, kind
    and mode (see comparable_previous): a load's footprint card's delta compares
    against it (lower is better). `events` (t, kind, stage) lets a running
    generate job's s/step be measured from when denoising started.
    """
    if job.get("kind", "load") != "load":
        return _generate_cards(job, stats, capacity=capacity, events=events)
    ended_unfinished = job["status"] in FINAL_STATUSES - {"succeeded"}
    metrics = job.get("metrics") or {}
    throughput = metrics.get("throughput_gbps")
    rate = fmt.rate_gbps(throughput) if throughput else (fmt.rate(stats.throughput) if stats.throughput else None)
    delta = rate
    if total_bytes:
        delta = f"{fmt.percent(stats.bytes_placed / total_bytes)}" + (f" · {rate}" if rate else "")
    cards = [
        Card(
            "Placed",
            fmt.gib(stats.bytes_placed),
            delta=delta,
            delta_color="off",
            help="destination bytes written, in the target dtype, and the share of the job's total (in the header); "
            "the rate is bytes read per second / 1e9 (GB/s)",
        ),
        _peak_in_use_card(stats),
        _footprint_card(metrics.get("footprint_ratio"), stats, job["status"] if ended_unfinished else None, previous),
    ]
    cards.append(_headroom_card(stats, capacity))
    if stats.peak_device is not None:
        cards.append(Card("Peak GPU allocated", fmt.gib(stats.peak_device), help="torch.cuda.memory_allocated"))
    else:
        cards.append(_peak_rss_card(stats))
    return cards


FOOTPRINT_HELP = (
    "max over samples of (VmRSS growth + GPU allocated growth) / bytes placed; 1.0× is the model itself. "
    "VmRSS counts file-backed pages (RssFile: mapped checkpoint files, page cache) as well as anonymous "
    "memory; the kernel can reclaim file-backed pages under pressure, so a load can finish under a memory "
    "limit below this ratio. What a limit enforces is the cgroup usage line on the chart."
)


def _footprint_card(final: float | None, stats: LiveStats, unfinished: str | None, previous: dict | None) -> Card:
    """The footprint ratio: final, or so far; for a job that ended without finishing, the
    figure so far or "— (failed)" with its real status word. The delta, only against a
    comparable job, is neutral when nothing changed."""
    footprint = final if final is not None else stats.footprint
    value = fmt.ratio(footprint)
    delta, color = None, "inverse"
    if unfinished and final is None:
        if stats.footprint:
            return Card("Footprint ratio", value, delta=f"so far ({unfinished})", delta_color="off", help=FOOTPRINT_HELP)
        value = f"{fmt.MISSING} ({unfinished})"
    prev_ratio = ((previous or {}).get("metrics") or {}).get("footprint_ratio")
    if footprint is not None and prev_ratio is not None:
        change = fmt.delta_ratio(footprint, prev_ratio)
        delta = f"{change} vs job {previous['id']}" if change else f"same as job {previous['id']}"
        color = "inverse" if change else "off"
    return Card("Footprint ratio", value, delta=delta, delta_color=color, help=FOOTPRINT_HELP)


def comparable_previous(job: dict, candidates: list[dict]) -> dict | None:
    """The newest succeeded job before `job` that measured the same thing: same checkpoint,
    component, kind and mode. Figures of other checkpoints say nothing about this one."""
    from dashboard.views.spec import checkpoint_key, spec_mode

    return next(
        (
            j
            for j in candidates
            if j["id"] < job["id"] and j["status"] == "succeeded"
            and checkpoint_key(j) == checkpoint_key(job) and spec_mode(j) == spec_mode(job)
        ),
        None,
    )


def _peak_in_use_card(stats: LiveStats) -> Card:
    return Card(
        "Peak in use",
        fmt.gib(stats.peak_in_use),
        help="peak system in use: max of MemTotal − MemAvailable over the job (/proc/meminfo); the whole machine, not just this job",
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


DENOISE_STAGE = "denoise.denoise"
"""The generate stage whose time the steps share (diffusers' denoising-loop block)."""


def seconds_per_step(job: dict, events: pd.DataFrame | None, elapsed: float) -> float | None:
    """Seconds per denoising step: the `denoise.denoise` stage's time (finished: from the metrics; running: from
    its stage_start events to their stage_end, the last to `elapsed` while it runs) over the steps it ran. The DiT
    loads in a stage of its own (`load.transformer`), and a compiled DiT's calls that compile too (`denoise.compile`,
    cut out of the loop's stage), so this is the steady denoising alone."""
    done = job.get("progress_done") or 0
    stage_seconds = (job.get("metrics") or {}).get("stage_seconds") or {}
    seconds = stage_seconds.get(DENOISE_STAGE)
    compiled = COMPILE_CALLS if COMPILE_STAGE in stage_seconds else 0
    if seconds is None and events is not None and len(events):
        ours = events[events["stage"] == DENOISE_STAGE]
        starts = [float(t) for t in ours[ours["kind"] == "stage_start"]["t"]]
        ends = [float(t) for t in ours[ours["kind"] == "stage_end"]["t"]]
        if starts:  # frozen once denoising ends: decoding is not a step
            seconds = sum(end - start for start, end in zip(starts, [*ends, elapsed]))
        compiled = int(((events["kind"] == "stage_end") & (events["stage"] == COMPILE_STAGE)).sum())
    calls = done - min(compiled, done)
    return seconds / calls if seconds and seconds > 0 and calls > 0 else None


def _generate_cards(job: dict, stats: LiveStats, *, capacity: int | None, events: pd.DataFrame | None) -> list[Card]:
    """Steps k/N with s/step, peak system in use, peak footprint (and the stage it
    happened in), min headroom and peak VmRSS: bytes placed say little here, since
    components load and leave stage by stage."""
    done, total = progress(job).done, progress(job).total
    per_step = seconds_per_step(job, events, stats.elapsed)
    metrics = job.get("metrics") or {}
    stage_peaks = {k: v for k, v in (metrics.get("stage_peaks") or {}).items() if isinstance(v, (int, float))}
    peak = metrics.get("peak_footprint") or stats.peak_resident
    peak_stage = max(stage_peaks, key=stage_peaks.get) if stage_peaks else stats.peak_resident_stage
    by_stage = " · ".join(f"{stage} {fmt.gib(value, 2)}" for stage, value in stage_peaks.items())
    return [
        Card(
            "Transformer passes",
            f"{done or 0}/{total}" if total else fmt.MISSING,
            delta=f"{per_step:.2f} s per pass" if per_step else None,
            delta_color="off",
            help="transformer passes done of the total (N steps make N - 1 passes); the time per pass is the "
            "denoising stage's time (denoise.denoise) over the passes done, frozen when denoising ends",
        ),
        _peak_in_use_card(stats),
        Card(
            "Peak footprint",
            fmt.gib(peak),
            delta=f"while {words.stage(peak_stage)}" if peak_stage else None,
            delta_color="off",
            help="peak_footprint: max over the stages of VmRSS + GPU allocated"
            + (f" (stage_peaks: {by_stage})" if by_stage else " (so far, from the samples)"),
        ),
        _headroom_card(stats, capacity),
        _peak_rss_card(stats),
        *_step_cache_card(metrics),
        *_ranks_card(metrics),
    ]


def _ranks_card(metrics: dict) -> list[Card]:
    """A finished parallel run's ranks and the largest peak among them (none for a run of one process)."""
    ranks = [r for r in metrics.get("ranks") or [] if isinstance(r, dict) and isinstance(r.get("peak"), (int, float))]
    if not ranks:
        return []
    top = max(ranks, key=lambda r: r["peak"])
    return [Card(
        "Ranks",
        f"{len(ranks)} GPUs",
        delta=f"largest peak {fmt.gib(top['peak'], 2)} on rank {top.get('rank')}",
        delta_color="off",
        help="one clip over several GPUs (--parallel): the transformer on every rank, its sequence split by "
             "diffusers' context parallelism; text encoder and VAEs on rank 0. Peak per rank (VmRSS + GPU "
             "allocated): " + " · ".join(f"rank {r.get('rank')} {fmt.gib(r['peak'], 2)}" for r in ranks),
    )]


def _step_cache_card(metrics: dict) -> list[Card]:
    """A finished cached run's transformer passes computed and reused (none for a run without a step cache, or
    from before they were counted)."""
    cache = (metrics.get("levers") or {}).get("step_cache")
    if cache is None or "steps_reused" not in metrics:
        return []
    return [Card(
        "Step cache",
        f"{metrics['steps_computed']} computed",
        delta=f"{metrics['steps_reused']} reused",
        delta_color="off",
        help=f"{cache}: transformer passes that ran every block, and passes whose cached modules (TaylorSeer: each "
             "block's attention) were predicted from earlier passes; counted at Drainboard's denoise block from the "
             "cache's schedule, since diffusers' hooks keep no count",
    )]
