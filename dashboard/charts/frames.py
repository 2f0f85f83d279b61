"""The data frames the charts draw: samples turned into the units and rows the axes read.

No Altair here: each function takes sample rows (storage's columns, bytes) and
returns a frame, so what a chart shows is tested as data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import pandas as pd

from dashboard import format as fmt
from dashboard.charts.style import OWN, SERIES, Series
from dashboard.format import GIB

XAxis = Literal["bytes", "percent", "seconds"]
"""What a memory chart's x axis measures: bytes placed (GiB, or MiB under 1 GiB), % of the checkpoint placed, or seconds since start."""
Fit = Literal["pool", "data", "baseline"]
"""A memory chart's y view: the whole pool, the data's own range, or each series above its first sample."""

MEMORY_COLUMNS = ("t", "stage", "bytes_placed", "vm_rss", "rss_file", "mem_available", "device_allocated")
"""Sample columns the memory chart needs (docs/architecture.md names)."""


def require(frame: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    """Raise ValueError naming the columns `what` needs that `frame` lacks."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} needs sample columns {', '.join(missing)}; got {', '.join(map(str, frame.columns)) or 'none'}")


def placed_unit(samples: pd.DataFrame, total_bytes: int | None) -> tuple[str, int]:
    """The unit bytes placed read in: MiB for a checkpoint under 1 GiB, else GiB."""
    if total_bytes:
        return fmt.size_unit(total_bytes)
    return fmt.size_unit(float(samples["bytes_placed"].max()) if len(samples) else None)


def x_values(frame: pd.DataFrame, x: XAxis, total_bytes: int | None, unit: int = GIB) -> pd.Series:
    if x == "seconds":
        return frame["t"].astype(float)
    if x == "bytes":
        return frame["bytes_placed"].astype(float) / unit
    if x == "percent":
        if not total_bytes:
            raise ValueError("x='percent' needs total_bytes (the checkpoint size) to be positive")
        return frame["bytes_placed"].astype(float) / total_bytes * 100
    raise ValueError(f"unknown x axis {x!r}; expected bytes, percent or seconds")


def x_title(x: XAxis, unit_name: str = "GiB") -> str:
    return {"bytes": f"{unit_name} placed", "percent": "% of checkpoint placed", "seconds": "seconds since job start"}[x]


def x_domain(x: XAxis, total_bytes: int | None, unit: int = GIB) -> list[float] | None:
    if x == "percent":
        return [0, 100]
    if x == "bytes" and total_bytes:
        return [0, total_bytes / unit]
    return None


def from_first_placement(samples: pd.DataFrame) -> pd.DataFrame:
    """A job's samples from the first that placed bytes on, in time order (all of them when none did): what a
    load took before it (the process starting, importing, opening the checkpoint) is not the load, and the
    footprint ratio leaves it out too (its baseline is taken just before the first tensor)."""
    ordered = samples.sort_values("t") if len(samples) else samples
    placing = ordered["bytes_placed"].notna().to_numpy() if len(ordered) else []
    return ordered.iloc[int(placing.argmax()):] if len(ordered) and placing.any() else ordered


def present_series(samples: pd.DataFrame, mem_total: int | None) -> list[Series]:
    """Series worth drawing: GPU allocated only when a device allocated anything, cgroup
    usage only when the job ran in a memory cgroup, system in use only when the machine's
    MemTotal is known."""
    chosen = []
    for s in SERIES:
        if s.key == "system_in_use":
            if mem_total:
                chosen.append(s)
        elif s.key == "device_allocated":
            if len(samples) and samples["device_allocated"].fillna(0).gt(0).any():
                chosen.append(s)
        elif s.key == "cgroup_usage":
            if "cgroup_usage" in samples and samples["cgroup_usage"].notna().any():
                chosen.append(s)
        else:
            chosen.append(s)
    return chosen


def series_values(samples: pd.DataFrame, s: Series, mem_total: int | None) -> pd.Series:
    """One series in bytes (system in use is derived from MemAvailable)."""
    raw = mem_total - samples["mem_available"] if s.key == "system_in_use" else samples[s.key]
    return raw.astype(float)


@dataclass(frozen=True)
class MemoryFrames:
    """What the memory chart draws, in the units its axes read."""

    wide: pd.DataFrame
    """One row per sample: x, t, stage, tensor, placed, headroom_gib, rank and one column per series (for the tooltip)."""
    long: pd.DataFrame
    """One row per sample and series (`series`, `value`), each also carrying the wide columns."""
    series: list[Series]
    """The series drawn, in legend order."""
    placed_unit: tuple[str, int]
    """(name, bytes) of the unit bytes placed read in (the x axis of the bytes view)."""
    y_unit: tuple[str, int]
    """(name, bytes) of the unit the series values read in."""
    baseline: bool
    """True when each series is shown minus its first sample (per rank)."""
    starts: dict[str, float]
    """Each series' first value (bytes, rank 0): what `baseline` subtracted, for placing limit lines."""


def memory_frames(
    samples: pd.DataFrame,
    *,
    x: XAxis,
    total_bytes: int | None = None,
    mem_total: int | None = None,
    baseline: bool = False,
) -> MemoryFrames:
    """The memory chart's frames. Absolute values read in GiB (the pool's scale);
    above the baseline they read in the unit bytes placed reads in when x is
    bytes (so y = x is the model itself), else in the unit their own size needs."""
    require(samples, MEMORY_COLUMNS, "memory chart")
    series = present_series(samples, mem_total)
    placed = placed_unit(samples, total_bytes)
    rank = samples["rank"].fillna(0).astype(int) if "rank" in samples else pd.Series(0, index=samples.index)
    raw = {s.label: series_values(samples, s, mem_total) for s in series}
    starts = {label: float(values.dropna().iloc[0]) for label, values in raw.items() if values.notna().any()}
    if baseline:
        raw = {label: values - values.groupby(rank).transform("first") for label, values in raw.items()}
        biggest = max((float(v.abs().max()) for v in raw.values() if v.notna().any()), default=None)
        y_unit = placed if x == "bytes" else fmt.size_unit(biggest)
    else:
        y_unit = ("GiB", GIB)
    wide = pd.DataFrame(
        {
            "x": x_values(samples, x, total_bytes, placed[1]),
            "t": samples["t"].astype(float),
            "stage": samples["stage"].fillna("").astype(str),
            "tensor": samples["tensor_name"].fillna("").astype(str) if "tensor_name" in samples else "",
            "placed": samples["bytes_placed"].astype(float) / placed[1],
            "headroom_gib": samples["mem_available"].astype(float) / GIB,
            "rank": rank,
        }
    )
    for label, values in raw.items():
        wide[label] = values / y_unit[1]
    # One row per sample and series; each row also carries every series' value
    # for the all-series-at-cursor tooltip.
    parts = [wide.assign(series=s.label, value=wide[s.label]) for s in series]
    long = pd.concat(parts, ignore_index=True).dropna(subset=["value"]) if parts else wide.assign(series="", value=0.0)
    return MemoryFrames(wide, long, series, placed, y_unit, baseline, starts)


@dataclass(frozen=True)
class Limit:
    """A bound the job ran under, drawn as a horizontal line on the series it bounds."""

    label: str
    """Text beside the line, e.g. "memory limit 1.00 GiB"."""
    series: str
    """Label of the series the bound applies to (cgroup usage, System in use)."""
    nbytes: float
    """Where the line sits on that series' absolute scale, in bytes."""
    over_start: bool = False
    """The bound is itself counted from the job's start (a budget): its label needs no "less the start"."""


def job_limits(
    spec: dict, mem_total: int | None, starts_in_use: float | None
) -> list[Limit]:
    """The lines a job's limits draw: the memory cgroup's limit on cgroup usage; the memory
    budget (most the job may add to system in use over its start) and the memory floor
    (least MemAvailable) on System in use."""
    limits = []
    if spec.get("memory_limit"):
        limits.append(Limit(f"memory limit {fmt.gib(spec['memory_limit'], 2)}", "cgroup usage", float(spec["memory_limit"])))
    if spec.get("memory_budget") and starts_in_use is not None:
        budget = float(spec["memory_budget"])
        limits.append(Limit(f"memory budget {fmt.gib(budget, 2)} over the start", "System in use", starts_in_use + budget, True))
    if spec.get("memory_floor") and mem_total:
        floor = float(spec["memory_floor"])
        limits.append(Limit(f"memory floor: {fmt.gib(floor, 2)} MemAvailable", "System in use", mem_total - floor))
    return limits


def limit_rows(limits: Sequence[Limit], frames: MemoryFrames, *, predicted: float | None = None) -> pd.DataFrame:
    """Where each limit line sits in the chart's y units (above the baseline: minus its series'
    start; a series not drawn has no line). `predicted`, a predicted growth in bytes over the
    start of VmRSS + GPU allocated, becomes a row of its own (series "predicted")."""
    drawn = {s.label for s in frames.series}
    rows = []
    for limit in limits:
        if limit.series not in drawn:
            continue
        start = frames.starts.get(limit.series, 0.0) if frames.baseline else 0.0
        label = limit.label + (f" (less the start, {fmt.gib(start, 2)})" if start and not limit.over_start else "")
        rows.append({"label": label, "series": limit.series, "value": (limit.nbytes - start) / frames.y_unit[1]})
    if predicted is not None:
        start = 0.0 if frames.baseline else frames.starts.get("VmRSS", 0.0) + frames.starts.get("GPU allocated", 0.0)
        rows.append({"label": f"predicted peak +{fmt.gib(predicted, 2)}", "series": "predicted",
                     "value": (start + predicted) / frames.y_unit[1]})
    return pd.DataFrame(rows, columns=["label", "series", "value"])


def stage_spans(samples: pd.DataFrame, xs: pd.Series) -> pd.DataFrame:
    """Consecutive runs of one stage as (stage, x0, x1, mid); each span ends where the next starts."""
    if samples.empty:
        return pd.DataFrame({"stage": pd.Series(dtype=str), "x0": [], "x1": [], "mid": []})
    stage = samples["stage"].fillna("").astype(str).reset_index(drop=True)
    xs = xs.reset_index(drop=True)
    run = (stage != stage.shift()).cumsum()
    spans = pd.DataFrame({"stage": stage, "x": xs, "run": run}).groupby("run", sort=True).agg(
        stage=("stage", "first"), x0=("x", "min"), x1=("x", "max")
    )
    spans["x1"] = spans["x0"].shift(-1).fillna(spans["x1"]).combine(spans["x1"], max)
    spans["mid"] = (spans["x0"] + spans["x1"]) / 2
    return spans[spans["stage"] != ""].reset_index(drop=True)


def event_x(events: pd.DataFrame, samples: pd.DataFrame, x: XAxis, total_bytes: int | None, unit: int = GIB) -> pd.Series:
    """Place events on the chart's x axis: directly in seconds, else at the
    bytes placed by the last sample taken before the event."""
    if x == "seconds" or samples.empty:
        return events["t"].astype(float)
    ordered = samples.sort_values("t")[["t", "bytes_placed"]]
    merged = pd.merge_asof(
        events[["t"]].astype(float).reset_index().sort_values("t"),
        ordered.astype({"t": float}),
        on="t",
        direction="backward",
    ).sort_values("index")
    placed = merged["bytes_placed"].fillna(0).astype(float).to_numpy()
    return pd.Series(placed / unit if x == "bytes" else placed / total_bytes * 100, index=events.index)


STRIP_LABEL_PX = 560
"""Plot width the strip's labels are fitted to: about the Job page's chart column on a laptop."""
LABEL_CHAR_PX = 6.5
"""Width of one character of the strip's 11 px labels, rounded up."""


def fitting_labels(spans: pd.DataFrame, extent: float | None, *, width_px: float = STRIP_LABEL_PX) -> pd.Series:
    """Each span's stage where its band, as a share of the x extent, is wide enough
    for the text at `width_px`; cut short with "…" where only part fits (at least
    four characters), else "" (every band keeps its tooltip)."""
    if not extent or extent <= 0:
        return pd.Series("", index=spans.index, dtype=str)
    room = ((spans["x1"] - spans["x0"]) / extent * width_px - 8) // LABEL_CHAR_PX
    return pd.Series(
        [stage if len(stage) <= n else (stage[: int(n) - 1] + "…" if n >= 5 else "") for stage, n in zip(spans["stage"], room)],
        index=spans.index,
        dtype=str,
    )


def compare_frame(samples: pd.DataFrame, *, x: Literal["percent", "seconds"], y: Literal["gib", "ratio"], subtract_start: bool) -> pd.DataFrame:
    """Long frame for the compare overlay: one row per job, sample and series,
    with `label` (the end-of-line text: the job, and its peak in the ratio view).

    samples: rows of several jobs with columns job, total_bytes (that job's
    checkpoint size), mem_total (the machine's MemTotal, may be empty) and
    MEMORY_COLUMNS. y="ratio" divides by each job's checkpoint size;
    subtract_start removes each job's first value per series.
    """
    require(samples, ("job", "total_bytes", "mem_total", *MEMORY_COLUMNS), "compare chart")
    rows = []
    for job, part in samples.groupby("job", sort=False):
        part = from_first_placement(part)
        if x == "percent":  # a sample that placed nothing has no % placed
            part = part[part["bytes_placed"].notna()]
            if part.empty:
                continue
        total = float(part["total_bytes"].iloc[0])
        mem_total = part["mem_total"].iloc[0]
        mem_total = mem_total if pd.notna(mem_total) else None
        xs = part["t"].astype(float) - float(part["t"].min()) if x == "seconds" else part["bytes_placed"].astype(float) / total * 100
        rows.append(_own_rows(job, part, xs, y, total))
        for s in present_series(part, mem_total):
            values = series_values(part, s, mem_total)
            keep = values.notna()
            values = values[keep]
            if subtract_start and len(values):
                values = values - values.iloc[0]
            values = values / total if y == "ratio" else values / GIB
            label = f"{job} peak {fmt.ratio(values.max())}" if y == "ratio" and len(values) else str(job)
            rows.append(
                pd.DataFrame({"job": job, "series": s.label, "x": xs[keep].to_numpy(), "value": values.to_numpy(), "label": label})
            )
    if not rows:
        return pd.DataFrame(
            {"job": pd.Series(dtype=str), "series": pd.Series(dtype=str), "x": [], "value": [], "label": pd.Series(dtype=str)}
        )
    return pd.concat(rows, ignore_index=True)


def _own_rows(job: str, part: pd.DataFrame, xs: pd.Series, y: Literal["gib", "ratio"], total: float) -> pd.DataFrame:
    """The job's own memory (`part` from its first placement on): (VmRSS − first VmRSS) + (GPU allocated −
    first), in GiB, or in the ratio view over the job's checkpoint size, so its peak is the footprint ratio
    (docs/metrics.md: the load's growth over the bytes it placed). The label quotes the job's recorded
    `footprint` (its load report's footprint_ratio) when the samples carry one, so Compare reads the same number
    as the Job page and History."""
    rss = part["vm_rss"].astype(float)
    device = part["device_allocated"].fillna(0).astype(float)
    grown = (rss - rss.iloc[0]) + (device - device.iloc[0])
    keep = grown.notna()
    values = grown[keep] / (total if y == "ratio" else GIB)
    recorded = part["footprint"].iloc[0] if "footprint" in part and pd.notna(part["footprint"].iloc[0]) else None
    peak = recorded if recorded is not None else (float(values.max()) if y == "ratio" and len(values) else None)
    label = f"{job} footprint {fmt.ratio(peak)}" if peak is not None else str(job)
    return pd.DataFrame({"job": job, "series": OWN.label, "x": xs[keep].to_numpy(), "value": values.to_numpy(), "label": label})


LABEL_GAP = 0.07
"""Least distance between two end-of-line labels in one panel, as a share of the y range (about 15 px of 220)."""


def end_label_positions(frame: pd.DataFrame, gap: float = LABEL_GAP) -> pd.Series:
    """Where each end-of-line label sits: at its line's last value, pushed apart within
    each panel so that lines ending close together (drain and stream) keep readable labels."""
    positions = frame["value"].astype(float).copy()
    ends = frame[frame["end"]] if len(frame) else frame
    if ends.empty:
        return positions
    step = gap * max(float(frame["value"].max() - min(0.0, float(frame["value"].min()))), 1e-9)
    for _, panel in ends.groupby("series"):
        previous = None
        for index, value in panel["value"].sort_values().items():
            placed = value if previous is None else max(value, previous + step)
            positions[index] = placed
            previous = placed
    return positions
