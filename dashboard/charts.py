"""Altair chart builders: pure functions from data frames to charts.

No `st.*` calls and no database access here, so each builder is tested by
calling it and reading `.to_dict()`. Every builder checks the columns it needs
and raises ValueError naming the missing ones; an empty frame gives a valid,
empty chart. Colours and styles are fixed (UX.md, Okabe-Ito) so a series looks
the same on every page; red (#D55E00) means only the wall or a kill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import altair as alt
import pandas as pd

from dashboard import format as fmt
from dashboard.format import GIB

XAxis = Literal["bytes", "percent", "seconds"]
"""What a memory chart's x axis measures: bytes placed (GiB, or MiB under 1 GiB), % of the checkpoint placed, or seconds since start."""
Fit = Literal["pool", "data", "baseline"]
"""A memory chart's y view: the whole pool, the data's own range, or each series above its first sample."""

WALL = "#D55E00"
"""The capacity rule, the danger zone and the kill marker; nothing else is red."""
POLICY = "#CC79A7"
"""Policy-decision rules and diamonds."""
STAGE_GRAYS = ["#e6e6e6", "#cfcfcf", "#dadada", "#c2c2c2", "#e0e0e0", "#c9c9c9"]
"""Muted grays for stage bands: stages are context, not data."""
JOB_DASHES = [[1, 0], [8, 4], [4, 3], [1, 3], [8, 3, 1, 3]]
"""Dash patterns that tell up to five compared jobs apart (solid, long, short, dot, dash-dot)."""
MAX_COMPARED = len(JOB_DASHES)
POLICY_EVENTS = ("decision", "policy")
"""Event kinds drawn as policy-decision rules."""
STEP_EVENTS = ("step",)
"""Event kinds drawn as ticks on the stage strip (one per denoising step)."""
"""The Compare overlay draws at most this many jobs."""
MULTI_RANK_WIDTH = 620
"""Panel width when several ranks stack (a concat cannot stretch to its column)."""
CHART_HEIGHT = 380
"""Fixed height of the main memory chart so live refreshes never move the layout."""


@dataclass(frozen=True)
class Series:
    """One memory curve: where it comes from and how it is always drawn."""

    key: str
    """Column name in the derived frame (bytes)."""
    label: str
    """Legend label."""
    source: str
    """Where the number is read, shown in tooltips so gaps between series make sense."""
    color: str
    """Fixed Okabe-Ito colour."""
    dash: tuple[int, ...]
    """Stroke dash; empty is solid."""
    width: float
    """Stroke width in px."""


SERIES: tuple[Series, ...] = (
    Series("system_in_use", "System in use", "/proc/meminfo (MemTotal − MemAvailable)", "#009E73", (), 2.5),
    Series("vm_rss", "VmRSS", "worker /proc status", "#0072B2", (), 1.8),
    Series("rss_file", "RssFile", "worker /proc status (part of VmRSS)", "#56B4E9", (6, 4), 1.8),
    Series("device_allocated", "GPU allocated", "torch allocator", "#E69F00", (), 1.8),
)
"""Every memory series, in legend order."""

_BY_LABEL = {s.label: s for s in SERIES}

MEMORY_COLUMNS = ("t", "stage", "bytes_placed", "vm_rss", "rss_file", "mem_available", "device_allocated")
"""Sample columns the memory chart needs (docs/architecture.md names)."""


def _require(frame: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} needs sample columns {', '.join(missing)}; got {', '.join(map(str, frame.columns)) or 'none'}")


def series_color_scale(labels: Sequence[str] | None = None) -> alt.Scale:
    """The fixed colour scale, restricted to `labels` (all series by default)."""
    chosen = [_BY_LABEL[label] for label in labels] if labels else list(SERIES)
    return alt.Scale(domain=[s.label for s in chosen], range=[s.color for s in chosen])


def placed_unit(samples: pd.DataFrame, total_bytes: int | None) -> tuple[str, int]:
    """The unit bytes placed read in: MiB for a checkpoint under 1 GiB, else GiB."""
    if total_bytes:
        return fmt.size_unit(total_bytes)
    return fmt.size_unit(float(samples["bytes_placed"].max()) if len(samples) else None)


def _x_values(frame: pd.DataFrame, x: XAxis, total_bytes: int | None, unit: int = GIB) -> pd.Series:
    if x == "seconds":
        return frame["t"].astype(float)
    if x == "bytes":
        return frame["bytes_placed"].astype(float) / unit
    if x == "percent":
        if not total_bytes:
            raise ValueError("x='percent' needs total_bytes (the checkpoint size) to be positive")
        return frame["bytes_placed"].astype(float) / total_bytes * 100
    raise ValueError(f"unknown x axis {x!r}; expected bytes, percent or seconds")


def _x_title(x: XAxis, unit_name: str = "GiB") -> str:
    return {"bytes": f"{unit_name} placed", "percent": "% of checkpoint placed", "seconds": "seconds since job start"}[x]


def _x_domain(x: XAxis, total_bytes: int | None, unit: int = GIB) -> list[float] | None:
    if x == "percent":
        return [0, 100]
    if x == "bytes" and total_bytes:
        return [0, total_bytes / unit]
    return None


def present_series(samples: pd.DataFrame, mem_total: int | None) -> list[Series]:
    """Series worth drawing: GPU allocated only when a device allocated anything,
    system in use only when the machine's MemTotal is known."""
    chosen = []
    for s in SERIES:
        if s.key == "system_in_use":
            if mem_total:
                chosen.append(s)
        elif s.key == "device_allocated":
            if len(samples) and samples["device_allocated"].fillna(0).gt(0).any():
                chosen.append(s)
        else:
            chosen.append(s)
    return chosen


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
    _require(samples, MEMORY_COLUMNS, "memory chart")
    series = present_series(samples, mem_total)
    placed = placed_unit(samples, total_bytes)
    rank = samples["rank"].fillna(0).astype(int) if "rank" in samples else pd.Series(0, index=samples.index)
    raw = {
        s.label: (mem_total - samples["mem_available"] if s.key == "system_in_use" else samples[s.key]).astype(float)
        for s in series
    }
    if baseline:
        raw = {label: values - values.groupby(rank).transform("first") for label, values in raw.items()}
        biggest = max((float(v.abs().max()) for v in raw.values() if len(v)), default=None)
        y_unit = placed if x == "bytes" else fmt.size_unit(biggest)
    else:
        y_unit = ("GiB", GIB)
    wide = pd.DataFrame(
        {
            "x": _x_values(samples, x, total_bytes, placed[1]),
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
    long = pd.concat(parts, ignore_index=True) if parts else wide.assign(series="", value=0.0)
    return MemoryFrames(wide, long, series, placed, y_unit, baseline)


def stage_spans(samples: pd.DataFrame, x_values: pd.Series) -> pd.DataFrame:
    """Consecutive runs of one stage as (stage, x0, x1, mid); each span ends where the next starts."""
    if samples.empty:
        return pd.DataFrame({"stage": pd.Series(dtype=str), "x0": [], "x1": [], "mid": []})
    stage = samples["stage"].fillna("").astype(str).reset_index(drop=True)
    xs = x_values.reset_index(drop=True)
    run = (stage != stage.shift()).cumsum()
    spans = pd.DataFrame({"stage": stage, "x": xs, "run": run}).groupby("run", sort=True).agg(
        stage=("stage", "first"), x0=("x", "min"), x1=("x", "max")
    )
    spans["x1"] = spans["x0"].shift(-1).fillna(spans["x1"]).combine(spans["x1"], max)
    spans["mid"] = (spans["x0"] + spans["x1"]) / 2
    return spans[spans["stage"] != ""].reset_index(drop=True)


def _event_x(events: pd.DataFrame, samples: pd.DataFrame, x: XAxis, total_bytes: int | None, unit: int = GIB) -> pd.Series:
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


STRIP_PX = (-26, -6)
"""Pixel rows of the stage strip: just above the plot area, inside the chart's own layer."""
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


def stage_strip(
    spans: pd.DataFrame,
    *,
    x_scale: alt.Scale | None = None,
    steps: pd.Series | None = None,
    extent: float | None = None,
) -> alt.LayerChart:
    """A 20 px state timeline of stages (gray bands with labels) drawn above the plot area, one
    tick per denoising step. It is a layer of the memory chart, so it shares the x scale and
    the chart stays one view that stretches to its column. `extent` is the width of the x
    domain: only bands wide enough for their text get a label (see fitting_labels);
    without it the spans' own extent is used."""
    order = list(dict.fromkeys(spans["stage"]))
    scale = x_scale or alt.Scale(zero=True)
    if extent is None and len(spans):
        extent = float(spans["x1"].max()) - min(0.0, float(spans["x0"].min()))
    # Literal fills, not a colour scale: a scale here would merge with the series colours.
    shaded = spans.assign(
        fill=spans["stage"].map({stage: STAGE_GRAYS[i % len(STAGE_GRAYS)] for i, stage in enumerate(order)}),
        label=fitting_labels(spans, extent),
    )
    base = alt.Chart(shaded)
    top, bottom = STRIP_PX
    bands = base.mark_rect(stroke="white", strokeWidth=1).encode(
        x=alt.X("x0:Q", scale=scale),
        x2="x1:Q",
        y=alt.value(top),
        y2=alt.value(bottom),
        color=alt.Color("fill:N", scale=None),
        tooltip=[alt.Tooltip("stage:N", title="stage")],
    )
    labels = alt.Chart(shaded[shaded["label"] != ""]).mark_text(fontSize=11, color="#333").encode(
        x=alt.X("mid:Q", scale=scale), y=alt.value((top + bottom) / 2), text="label:N"
    )
    layers = [bands, labels]
    if steps is not None and len(steps):
        ticks = alt.Chart(pd.DataFrame({"x": steps.to_numpy()})).mark_rule(color="#555", strokeWidth=1).encode(
            x=alt.X("x:Q", scale=scale), y=alt.value(bottom - 6), y2=alt.value(bottom)
        )
        layers.append(ticks)
    return alt.layer(*layers)


def memory_chart(
    samples: pd.DataFrame,
    *,
    x: XAxis = "bytes",
    total_bytes: int | None = None,
    mem_total: int | None = None,
    capacity: int | None = None,
    fit: Fit = "pool",
    events: pd.DataFrame | None = None,
    killed: bool = False,
    height: int = CHART_HEIGHT,
) -> alt.LayerChart | alt.VConcatChart:
    """The Job page's chart: stage strip above memory curves, sharing x (one panel per rank).

    samples: rows with MEMORY_COLUMNS (bytes), optionally tensor_name and rank
    (several ranks draw one panel each). total_bytes fixes the x domain of the
    bytes/percent views at the checkpoint size so live refreshes never rescale.
    mem_total adds "System in use"; capacity draws the wall (dashed rule and
    the >=90% danger zone); fit="pool" scales y to the whole pool, "data" to
    the curves, "baseline" shows each series minus its first sample (what the
    job itself added; no wall) with a faint y = x diagonal, the model itself,
    when x is bytes placed. Bytes read in MiB under 1 GiB. events
    (columns t, kind, message) adds policy decisions (POLICY_EVENTS) as pink
    rules and denoising steps (STEP_EVENTS) as ticks on the stage strip.
    killed marks the last sample with the red kill rule and a cross.
    """
    frames = memory_frames(samples, x=x, total_bytes=total_bytes, mem_total=mem_total, baseline=fit == "baseline")
    wide, long = frames.wide, frames.long
    if events is not None:
        _require(events, ("t", "kind", "message"), "memory chart events")
    x_domain = _x_domain(x, total_bytes, frames.placed_unit[1])
    x_scale = alt.Scale(domain=x_domain) if x_domain else alt.Scale(zero=True)
    y_top = None
    peak = float(long["value"].max()) if len(long) else 0.0
    if fit == "baseline":
        capacity = None  # each series starts at 0 here, so the wall has no place on this axis
    elif fit == "pool" and capacity:
        y_top = max(capacity / GIB * 1.04, peak * 1.04)
    elif capacity and peak * 1.25 < capacity / GIB:
        capacity = None  # fitting the data: the wall is far off scale, so leave it out
    y_scale = alt.Scale(domain=[0, y_top]) if y_top else alt.Scale(zero=True)

    spans = stage_spans(samples, wide["x"])
    event_x = _event_x(events, samples, x, total_bytes, frames.placed_unit[1]) if events is not None and len(events) else None
    steps = event_x[events["kind"].isin(STEP_EVENTS)] if event_x is not None else None
    extent = (x_domain[1] - x_domain[0]) if x_domain else (float(wide["x"].max()) - min(0.0, float(wide["x"].min())) if len(wide) else None)
    strip = stage_strip(spans, x_scale=x_scale, steps=steps, extent=extent) if len(spans) else None
    x_end = x_domain[1] if x_domain else None
    diagonal = None
    if fit == "baseline" and x == "bytes":
        diagonal = x_end or (float(wide["x"].max()) if len(wide) else None)

    ranks = sorted(wide["rank"].unique()) if len(wide) else [0]
    panels = [
        _memory_panel(
            wide[wide["rank"] == r] if len(wide) else wide,
            long[long["rank"] == r] if len(long) else long,
            frames,
            x=x,
            x_scale=x_scale,
            x_end=x_end,
            y_scale=y_scale,
            diagonal=diagonal,
            spans=spans,
            capacity=capacity,
            events=events.assign(x=event_x) if event_x is not None else None,
            killed=killed,
            height=height if len(ranks) == 1 else max(180, height // len(ranks)),
            title=f"rank {r}" if len(ranks) > 1 else None,
            key=f"r{r}",
            strip=strip,
        )
        for r in ranks
    ]
    if len(panels) == 1:
        return panels[0]
    return alt.vconcat(*[p.properties(width=MULTI_RANK_WIDTH) for p in panels], spacing=36).resolve_scale(x="shared")


def _unit_format(unit_name: str) -> str:
    """Axis tick format: one decimal of GiB, whole MiB."""
    return ".1f" if unit_name == "GiB" else ",.0f"


def _memory_panel(
    wide: pd.DataFrame,
    long: pd.DataFrame,
    frames: MemoryFrames,
    *,
    x: XAxis,
    x_scale: alt.Scale,
    x_end: float | None,
    y_scale: alt.Scale,
    diagonal: float | None,
    spans: pd.DataFrame,
    capacity: int | None,
    events: pd.DataFrame | None,
    killed: bool,
    height: int,
    title: str | None,
    key: str,
    strip: alt.LayerChart | None,
) -> alt.LayerChart:
    series = frames.series
    labels = [s.label for s in series]
    placed_name = frames.placed_unit[0]
    y_name = frames.y_unit[0] + (" above the job's first sample" if frames.baseline else "")
    x_axis = alt.Axis(format=_unit_format(placed_name)) if x == "bytes" else alt.Axis()
    x_enc = alt.X("x:Q", title=_x_title(x, placed_name), scale=x_scale, axis=x_axis)
    y_enc = alt.Y("value:Q", title=y_name, scale=y_scale, axis=alt.Axis(format=_unit_format(frames.y_unit[0])))
    legend_pick = alt.selection_point(fields=["series"], bind="legend", name=f"mute_{key}")
    cursor = alt.selection_point(
        fields=["x"], nearest=True, on="pointerover", empty=False, clear="pointerout", name=f"cursor_{key}"
    )
    layers: list[alt.Chart] = [strip] if strip is not None else []

    if len(spans) > 1:
        layers.append(
            alt.Chart(spans.iloc[1:]).mark_rule(color="#999", strokeWidth=1, opacity=0.5).encode(x=alt.X("x0:Q", scale=x_scale))
        )
    if capacity:
        cap = capacity / GIB
        zone = pd.DataFrame({"y0": [cap * 0.9], "y1": [cap], "label": [f"capacity {cap:.1f} GiB"]})
        layers.append(alt.Chart(zone).mark_rect(color=WALL, opacity=0.08).encode(y=alt.Y("y0:Q", scale=y_scale), y2="y1:Q"))
        layers.append(
            alt.Chart(zone).mark_rule(color=WALL, strokeDash=[6, 4], strokeWidth=1.5).encode(y=alt.Y("y1:Q", scale=y_scale))
        )
        layers.append(
            alt.Chart(zone)
            .mark_text(color=WALL, align="right", baseline="bottom", dy=-3, fontSize=11)
            .encode(y=alt.Y("y1:Q", scale=y_scale), x=alt.value("width"), text="label:N")
        )

    if diagonal:
        model = pd.DataFrame({"x": [0.0, diagonal], "value": [0.0, diagonal], "label": ["", "the model itself (1.0×)"]})
        line = alt.Chart(model).encode(x=alt.X("x:Q", scale=x_scale), y=alt.Y("value:Q", scale=y_scale))
        layers.append(line.mark_line(color="#888", strokeDash=[2, 3], strokeWidth=1.2, opacity=0.7))
        layers.append(
            line.mark_text(color="#777", align="right", baseline="top", dx=-4, dy=4, fontSize=11).encode(text="label:N")
        )

    color = alt.Color("series:N", scale=series_color_scale(labels), legend=alt.Legend(title=None, orient="bottom"))
    layers.append(
        alt.Chart(long)
        .mark_line(interpolate="step-after", clip=True)
        .encode(
            x=x_enc,
            y=y_enc,
            color=color,
            strokeDash=alt.StrokeDash(
                "series:N",
                scale=alt.Scale(domain=labels, range=[list(s.dash) or [1, 0] for s in series]),
                legend=None,
            ),
            strokeWidth=alt.StrokeWidth(
                "series:N", scale=alt.Scale(domain=labels, range=[s.width for s in series]), legend=None
            ),
            opacity=alt.when(legend_pick).then(alt.value(1.0)).otherwise(alt.value(0.15)),
            detail="series:N",
        )
    )
    layers.append(alt.Chart(long).mark_rule(color="#666", strokeWidth=1, opacity=0.6).encode(x=x_enc).transform_filter(cursor))
    # One layer carries both selections (Altair lifts params of several layers onto every view,
    # which Vega rejects as duplicate signals); nearest needs point marks, not lines.
    tooltip = [
        alt.Tooltip("tensor:N", title="tensor"),
        alt.Tooltip("stage:N", title="stage"),
        alt.Tooltip("placed:Q", title=f"{placed_name} placed", format=".2f"),
        alt.Tooltip("t:Q", title="seconds", format=".2f"),
        *[alt.Tooltip(f"{s.label}:Q", title=f"{s.label}, {y_name} ({s.source})", format=".2f") for s in series],
        alt.Tooltip("headroom_gib:Q", title="MemAvailable (headroom, GiB)", format=".2f"),
    ]
    points = (
        alt.Chart(long)
        .mark_point(filled=True, size=36, clip=True)
        .encode(
            x=x_enc,
            y=y_enc,
            color=color,
            opacity=alt.when(cursor).then(alt.value(1.0)).otherwise(alt.value(0.0)),
            tooltip=tooltip,
        )
        .add_params(legend_pick, cursor)
    )

    if events is not None:
        policy = events[events["kind"].isin(POLICY_EVENTS)]
        if len(policy):
            pol = alt.Chart(policy[["x", "t", "message"]])
            layers.append(pol.mark_rule(color=POLICY, strokeWidth=1).encode(x=alt.X("x:Q", scale=x_scale), tooltip=["message:N"]))
            layers.append(
                pol.mark_point(shape="diamond", filled=True, color=POLICY, size=60)
                .encode(x=alt.X("x:Q", scale=x_scale), y=alt.value(4), tooltip=["message:N", alt.Tooltip("t:Q", format=".2f")])
            )

    if killed and len(wide):
        last = wide.iloc[[-1]]
        top = max(labels, key=lambda label: float(last[label].iloc[0])) if labels else None
        kill = pd.DataFrame(
            {
                "x": last["x"].to_numpy(),
                "value": [float(last[top].iloc[0]) if top else 0.0],
                "label": ["process killed"],
                "end": [x_end if x_end is not None else float(last["x"].iloc[0])],
            }
        )
        mark = alt.Chart(kill)
        if kill["end"].iloc[0] > kill["x"].iloc[0]:
            layers.append(mark.mark_rect(color="#9e9e9e", opacity=0.18).encode(x=alt.X("x:Q", scale=x_scale), x2="end:Q"))
            layers.append(
                mark.mark_text(color="#555", align="left", dx=6, baseline="top", dy=6, text="no data — process killed").encode(
                    x=alt.X("x:Q", scale=x_scale), y=alt.value(0)
                )
            )
        layers.append(mark.mark_rule(color=WALL, strokeWidth=2).encode(x=alt.X("x:Q", scale=x_scale)))
        layers.append(
            mark.mark_text(text="✕", color=WALL, fontSize=18, fontWeight="bold").encode(
                x=alt.X("x:Q", scale=x_scale), y=alt.Y("value:Q", scale=y_scale), tooltip=["label:N"]
            )
        )

    chart = alt.layer(*layers, points).properties(height=height)
    return chart.properties(title=title) if title else chart


def compare_frame(samples: pd.DataFrame, *, x: Literal["percent", "seconds"], y: Literal["gib", "ratio"], subtract_start: bool) -> pd.DataFrame:
    """Long frame for the compare overlay: one row per job, sample and series,
    with `label` (the end-of-line text: the job, and its peak in the ratio view).

    samples: rows of several jobs with columns job, total_bytes (that job's
    checkpoint size), mem_total (the machine's MemTotal, may be empty) and
    MEMORY_COLUMNS. y="ratio" divides by each job's checkpoint size;
    subtract_start removes each job's first value per series.
    """
    _require(samples, ("job", "total_bytes", "mem_total", *MEMORY_COLUMNS), "compare chart")
    rows = []
    for job, part in samples.groupby("job", sort=False):
        part = part.sort_values("t")
        total = float(part["total_bytes"].iloc[0])
        mem_total = part["mem_total"].iloc[0]
        xs = part["t"].astype(float) - float(part["t"].min()) if x == "seconds" else part["bytes_placed"].astype(float) / total * 100
        for s in present_series(part, mem_total if pd.notna(mem_total) else None):
            raw = (mem_total - part["mem_available"]) if s.key == "system_in_use" else part[s.key]
            values = raw.astype(float)
            if subtract_start:
                values = values - values.iloc[0]
            values = values / total if y == "ratio" else values / GIB
            label = f"{job} peak {fmt.ratio(values.max())}" if y == "ratio" and len(values) else str(job)
            rows.append(
                pd.DataFrame({"job": job, "series": s.label, "x": xs.to_numpy(), "value": values.to_numpy(), "label": label})
            )
    if not rows:
        return pd.DataFrame(
            {"job": pd.Series(dtype=str), "series": pd.Series(dtype=str), "x": [], "value": [], "label": pd.Series(dtype=str)}
        )
    return pd.concat(rows, ignore_index=True)


RATIO_FIRST = ("VmRSS", "GPU allocated")
"""Panels the × checkpoint view leads with: the series DESIGN's footprint_ratio is made of."""
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


def compare_chart(
    samples: pd.DataFrame,
    *,
    x: Literal["percent", "seconds"] = "percent",
    y: Literal["gib", "ratio"] = "gib",
    subtract_start: bool = False,
    capacity: int | None = None,
    fit: Literal["pool", "data"] = "data",
) -> alt.FacetChart:
    """Small multiples, one panel per series (each keeps its colour), jobs told
    apart by dash pattern and an end-of-line label; at most five jobs.

    y="ratio" adds reference rules at 1.0× and 2.0×. `job` labels should be
    short and unique (e.g. "#7 drain").
    """
    frame = compare_frame(samples, x=x, y=y, subtract_start=subtract_start)
    jobs = list(dict.fromkeys(frame["job"])) if len(frame) else list(dict.fromkeys(samples.get("job", [])))
    if len(jobs) > MAX_COMPARED:
        raise ValueError(f"compare draws at most {MAX_COMPARED} jobs; got {len(jobs)}")
    labels = [s.label for s in SERIES if s.label in set(frame["series"])] or [SERIES[1].label]
    if y == "ratio":
        # The footprint ratio is the process's own growth (VmRSS + GPU allocated): lead with those
        # panels; System in use is the whole machine, which other processes move too.
        labels.sort(key=lambda label: label not in RATIO_FIRST)
    frame["end"] = ~frame.duplicated(["job", "series"], keep="last")
    frame["label_y"] = end_label_positions(frame)
    pick = alt.selection_point(fields=["job"], bind="legend", on="pointerover", clear="pointerout", name="job_pick")
    y_title = "× checkpoint size" if y == "ratio" else "GiB"
    y_domain = None
    if y == "gib" and fit == "pool" and capacity:
        y_domain = [0, max(capacity / GIB, float(frame["value"].max()) if len(frame) else 0) * 1.04]
    y_scale = alt.Scale(domain=y_domain) if y_domain else alt.Scale(zero=True)
    x_enc = alt.X(
        "x:Q",
        title="% of model placed" if x == "percent" else "seconds since job start",
        scale=alt.Scale(domain=[0, 100]) if x == "percent" else alt.Scale(zero=True),
    )
    base = alt.Chart().encode(x=x_enc)
    lines = base.mark_line(interpolate="step-after", strokeWidth=2).encode(
        y=alt.Y("value:Q", title=y_title, scale=y_scale, axis=alt.Axis(format=".2f" if y == "ratio" else ".1f")),
        color=alt.Color("series:N", scale=series_color_scale(labels), legend=None),
        strokeDash=alt.StrokeDash(
            "job:N", scale=alt.Scale(domain=jobs or [""], range=JOB_DASHES[: max(1, len(jobs))]), legend=alt.Legend(title="job", orient="top", symbolStrokeColor="#333")
        ),
        opacity=alt.when(pick).then(alt.value(1.0)).otherwise(alt.value(0.35)),
        detail="job:N",
        tooltip=[
            alt.Tooltip("job:N"),
            alt.Tooltip("series:N"),
            alt.Tooltip("x:Q", title="% placed" if x == "percent" else "seconds", format=".1f"),
            alt.Tooltip("value:Q", title=y_title, format=".2f"),
        ],
    ).add_params(pick)
    ends = base.transform_filter(alt.datum.end).mark_text(align="left", dx=4, fontSize=10, color="#333").encode(
        y=alt.Y("label_y:Q", scale=y_scale), text="label:N"
    )
    layers = [lines, ends]
    if y == "ratio":
        references = [alt.Chart().mark_rule(color="#888", strokeDash=[2, 2]).encode(y=alt.datum(r)) for r in (1.0, 2.0)]
        layers = references + layers
    elif capacity and fit == "pool":
        layers.insert(0, alt.Chart().mark_rule(color=WALL, strokeDash=[6, 4]).encode(y=alt.datum(capacity / GIB)))
    return (
        alt.layer(*layers, data=frame)
        .properties(height=220, width=320)
        .facet(facet=alt.Facet("series:N", sort=labels, title=None), columns=2)
        .resolve_scale(y="shared")
    )


def fit_forecast(in_use: int, predicted_peak: int, capacity: int) -> alt.LayerChart:
    """The Run page's "will it fit?" bar: current use plus the predicted peak
    against the wall; amber from 80% of capacity, red above it."""
    total = in_use + predicted_peak
    share = total / capacity if capacity else 0.0
    color = "#009E73" if share < 0.8 else ("#E69F00" if share <= 1.0 else WALL)
    bars = pd.DataFrame(
        {
            "part": ["in use now", "predicted peak of this job"],
            "x0": [0.0, in_use / GIB],
            "x1": [in_use / GIB, total / GIB],
            "gib": [in_use / GIB, predicted_peak / GIB],
            "color": ["#9e9e9e", color],
        }
    )
    top = max(capacity, total) / GIB * 1.02
    scale = alt.Scale(domain=[0, top])
    bar = alt.Chart(bars).mark_bar(height=22).encode(
        x=alt.X("x0:Q", scale=scale, title="GiB"),
        x2="x1:Q",
        color=alt.Color("color:N", scale=None),
        tooltip=["part:N", alt.Tooltip("gib:Q", title="GiB", format=".2f")],
    )
    wall = alt.Chart(pd.DataFrame({"cap": [capacity / GIB], "label": [f"{capacity / GIB:.1f} GiB"]}))
    rule = wall.mark_rule(color=WALL, strokeDash=[6, 4], strokeWidth=2).encode(x=alt.X("cap:Q", scale=scale))
    text = wall.mark_text(color=WALL, align="right", dx=-4, dy=-18, fontSize=11).encode(x=alt.X("cap:Q", scale=scale), text="label:N")
    return alt.layer(bar, rule, text).properties(height=60)


def pool_bar(used: int, cache: int, total: int, *, height: int = 34, axis: bool = True) -> alt.LayerChart:
    """nvitop-style bar of the one shared pool: used, page cache, free, with
    threshold ticks at 80% and 90%."""
    used_gib, total_gib = used / GIB, total / GIB
    cache_gib = min(cache, max(total - used, 0)) / GIB
    free_gib = max(total_gib - used_gib - cache_gib, 0.0)
    share = used / total if total else 0.0
    used_color = "#009E73" if share < 0.8 else ("#E69F00" if share < 0.9 else WALL)
    parts = pd.DataFrame(
        {
            "part": ["in use", "page cache", "free"],
            "x0": [0.0, used_gib, used_gib + cache_gib],
            "x1": [used_gib, used_gib + cache_gib, total_gib],
            "gib": [used_gib, cache_gib, free_gib],
            "color": [used_color, "#b9d7ea", "#f0f0f0"],
        }
    )
    scale = alt.Scale(domain=[0, total_gib])
    bar = alt.Chart(parts).mark_bar(height=height - 12).encode(
        x=alt.X("x0:Q", scale=scale, title=None, axis=alt.Axis(format=".0f", labelExpr="datum.label + ' GiB'") if axis else None),
        x2="x1:Q",
        color=alt.Color("color:N", scale=None),
        tooltip=["part:N", alt.Tooltip("gib:Q", title="GiB", format=".2f")],
    )
    marks = alt.Chart(pd.DataFrame({"x": [total_gib * 0.8, total_gib * 0.9]})).mark_tick(
        color="#555", thickness=2, size=height - 8
    ).encode(x=alt.X("x:Q", scale=scale))
    return alt.layer(bar, marks).properties(height=height)
