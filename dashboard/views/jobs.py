"""What the Job page says about a job, as plain functions of its row and samples.

No Streamlit here: the page draws what these return, and tests call them
directly with made-up rows.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import pandas as pd

from dashboard import format as fmt
from dashboard import words
from dashboard.views import failure
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
        """`loading 13/41`, `denoising 1/2`, or just the stage, in words (words.stage)."""
        stage = words.stage(self.stage) or "step"
        return f"{stage} {self.done or 0}/{self.total}" if self.total else words.stage(self.stage)

    @property
    def fraction(self) -> float | None:
        return min(1.0, (self.done or 0) / self.total) if self.total else None


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
        signal = job.get("signal") or "a signal"
        by = {"oom": " by the OOM killer", "guard": " by the memory guard"}.get(kill_kind(job), "")
        return f"Killed ({signal}){by} at {at}"
    if status == "cancelled":
        return f"Cancelled by the user at {at}"
    if status == "interrupted":
        return f"Interrupted (the worker stopped) at {at}"
    error = failure.plain((job.get("error") or "no error message recorded").splitlines()[0])
    return f"Failed at {at}: {error}"


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
    """For a job killed at its memory limit: the smallest limit that would have worked (failure.limit_needed)."""
    limit = killing_limit(job)
    if not limit:
        return None
    usage = baseline = None
    if samples is not None and len(samples):
        column = samples["cgroup_usage"] if "cgroup_usage" in samples and samples["cgroup_usage"].notna().any() else samples["vm_rss"]
        usage, baseline = int(column.max()), int(column.dropna().iloc[0])
    fraction = stats.bytes_placed / total_bytes if total_bytes and job.get("kind", "load") == "load" else None
    return failure.limit_needed(limit=limit, usage_at_kill=usage, baseline=baseline, placed_fraction=fraction,
                                predicted_peak=predicted)


MODE_COST = {"retain": 2.0, "drain": 1.16, "stream": 1.0}
"""Typical footprint of each placement mode, cheapest last: a retry offers only cheaper ones."""


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
        mode = (job.get("spec") or {}).get("mode")
        cost = MODE_COST.get(mode)
        if cost is not None:
            choices += [m for m, c in sorted(MODE_COST.items(), key=lambda kv: kv[1]) if c < cost]
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
    if choice in MODE_COST:
        return {"mode": choice}
    return {"memory_limit": suggested}


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
    """Seconds per denoising step: the `denoise.denoise` stage's time (finished: from the
    metrics; running: from its stage_start event to its stage_end, or to `elapsed` while it runs) over the steps done.
    The DiT loads in a stage of its own (`load.transformer`), so this is denoising alone."""
    done = job.get("progress_done") or 0
    if not done:
        return None
    seconds = ((job.get("metrics") or {}).get("stage_seconds") or {}).get(DENOISE_STAGE)
    if seconds is None and events is not None and len(events):
        started = events[(events["kind"] == "stage_start") & (events["stage"] == DENOISE_STAGE)]
        ended = events[(events["kind"] == "stage_end") & (events["stage"] == DENOISE_STAGE)]
        if len(started):  # frozen once denoising ends: decoding is not a step
            until = float(ended["t"].iloc[0]) if len(ended) else elapsed
            seconds = until - float(started["t"].iloc[0])
    return seconds / done if seconds and seconds > 0 else None


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
    ]


def metrics_table(metrics: dict | None) -> pd.DataFrame:
    """The job's final scalar metrics: readable label and value with its unit (the keys are the
    JSON's: `python -m jobs show --json`, the page's tooltip says so)."""
    rows = [
        {"metric": fmt.metric_label(name), "value": fmt.metric_value(name, value)}
        for name, value in (metrics or {}).items()
        if isinstance(value, (int, float, str, type(None))) and not isinstance(value, bool)
    ]
    return pd.DataFrame(rows, columns=["metric", "value"])


LOAD_REPORT_COLUMNS = (
    ("mode", "mode"), ("device", "device"), ("tensors_placed", "tensors"), ("bytes_placed", "placed"),
    ("load_seconds", "load time"), ("throughput_gbps", "throughput"), ("footprint_ratio", "footprint"),
    ("host_peak_ratio", "host peak"), ("excluded_bytes", "not read"),
)
"""The load report fields a generate job's per-component table shows, with their headings."""


def load_reports_table(metrics: dict | None) -> pd.DataFrame:
    """One row per component a generate job loaded (metrics["loads"]: component -> LoadReport dict)."""
    loads = (metrics or {}).get("loads") or {}
    rows = []
    for component, report in loads.items():
        row = {"component": words.component(component)}
        for key, heading in LOAD_REPORT_COLUMNS:
            value = (report or {}).get(key)
            row[heading] = fmt.metric_value(key, value) if key not in ("mode", "device") else (value or fmt.MISSING)
        rows.append(row)
    return pd.DataFrame(rows, columns=["component", *(h for _, h in LOAD_REPORT_COLUMNS)])


def event_table(events: pd.DataFrame, *, last: int | None = None) -> pd.DataFrame:
    """Events as (t, what, stage, message) rows in words, newest last; `last` keeps only the final ones.
    The internal kinds and stage names stay in the JSONL download."""
    columns = ["t", "what", "stage", "message"]
    if events.empty:
        return pd.DataFrame(columns=columns)
    table = events[["t", "kind", "stage", "message"]].tail(last) if last else events[["t", "kind", "stage", "message"]]
    return pd.DataFrame({
        "t": table["t"].map(fmt.duration).tolist(),
        "what": table["kind"].map(words.event).tolist(),
        "stage": table["stage"].map(lambda v: words.stage(v) if isinstance(v, str) else "").tolist(),
        "message": table["message"].map(event_message).tolist(),
    }, columns=columns)


def event_message(message: object) -> str:
    """An event's message with stage names in words (`load.text_encoder started` -> `loading the text encoder started`)."""
    if not isinstance(message, str):
        return ""
    head, space, rest = message.partition(" ")
    return f"{words.stage(head)}{space}{rest}" if "." in head or head in words.STAGE_WORDS else failure.plain(message)


def last_sample_table(sample: dict | None, mem_total: int | None) -> pd.DataFrame:
    """The last sample as readable (field, value) rows: what a killed job looked like at the end."""
    if not sample:
        return pd.DataFrame(columns=["field", "value"])
    rows = [
        ("t", fmt.duration(sample.get("t"))),
        ("stage", words.stage(sample.get("stage")) or fmt.MISSING),
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
    if sample.get("cgroup_usage") is not None:
        rows.append(("cgroup usage", fmt.gib(sample["cgroup_usage"], 2)))
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
        text = progress(job).text
        parts.append(f"▶ {len(running)} running: job {job['id']}" + (f" ({text})" if text else ""))
    if queued:
        parts.append(f"{len(queued)} queued")
    return " · ".join(parts)


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
