"""Altair charts of the machine itself: the memory pool bar, the fit forecast bar, and the
System page's memory and pressure history. Pure functions of numbers and frames.

Colours read on light and dark themes alike: parts of the pool are Okabe-Ito hues or
a translucent gray, never near-white; red (#D55E00) means only the wall.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from dashboard import format as fmt
from dashboard.charts.style import WALL, palette
from dashboard.host import HostMemory

IN_USE = "#009E73"
"""System in use (MemTotal − MemAvailable), as on the Job page."""
AMBER = "#E69F00"
"""In use from 80% of the pool."""
CACHE = "#56B4E9"
"""Reclaimable page cache (MemAvailable − MemFree)."""
FREE = "#9e9e9e"
"""MemFree, drawn translucent so it reads on both themes."""
TICK = "#888888"
"""Threshold ticks and their labels."""
THRESHOLDS = (0.8, 0.9)
"""Shares of the pool marked on the bar: amber from the first, red from the second."""
AXIS_PX = 32
"""Height an x axis with labels takes: Streamlit sizes a stretched chart to its whole height, axes included."""
AVAILABLE = "#8E6BB8"
"""MemAvailable in the history: its own hue, never the page cache's blue of the pool bar above it."""
PRESSURE_COLORS = {"some": AMBER, "full": WALL}
"""PSI lines: some task stalled (amber), every task stalled (red: the box is thrashing)."""


def in_use_color(share: float) -> str:
    return IN_USE if share < THRESHOLDS[0] else AMBER if share < THRESHOLDS[1] else WALL


def pool_parts(host: HostMemory) -> pd.DataFrame:
    """The pool split into what adds up to MemTotal: system in use, reclaimable cache, MemFree."""
    total = host.total
    in_use = min(host.in_use, total)
    free = min(host.free, total - in_use)
    cache = total - in_use - free
    share = in_use / total if total else 0.0
    return pd.DataFrame(
        {
            "part": ["system in use", "page cache (reclaimable)", "MemFree"],
            "x0": [0, in_use, in_use + cache],
            "x1": [in_use, in_use + cache, total],
            "bytes": [in_use, cache, free],
            "color": [in_use_color(share), CACHE, FREE],
            "opacity": [1.0, 0.75, 0.35],
        }
    ).assign(
        gib=lambda f: f["bytes"] / fmt.GIB,
        x0=lambda f: f["x0"] / fmt.GIB,
        x1=lambda f: f["x1"] / fmt.GIB,
        size=lambda f: f["bytes"].map(fmt.gib),
    )


def pool_bar(host: HostMemory, *, axis: bool = True) -> alt.LayerChart:
    """nvitop-style bar of the pool: in use, reclaimable page cache and MemFree, with the
    80% and 90% ticks labelled above it. Without `axis` (the header), the ticks carry the only text.
    Rows are placed in pixels (labels 0-11, bar 14-28) so nothing is clipped at any width."""
    total_gib = host.total / fmt.GIB
    scale = alt.Scale(domain=[0, total_gib], nice=False)
    x_axis = alt.Axis(format=".0f", tickMinStep=1, labelExpr="datum.label + ' GiB'", title=None, grid=False) if axis else None
    bar = alt.Chart(pool_parts(host)).mark_bar().encode(
        x=alt.X("x0:Q", scale=scale, axis=x_axis),
        x2="x1:Q",
        y=alt.value(14),
        y2=alt.value(28),
        color=alt.Color("color:N", scale=None),
        opacity=alt.Opacity("opacity:Q", scale=None),
        tooltip=[alt.Tooltip("part:N", title="part"), alt.Tooltip("size:N", title="size")],
    )
    marks = pd.DataFrame({"x": [total_gib * t for t in THRESHOLDS], "label": [fmt.percent(t) for t in THRESHOLDS]})
    ticks = alt.Chart(marks).mark_rule(color=TICK, strokeWidth=2).encode(
        x=alt.X("x:Q", scale=scale), y=alt.value(11), y2=alt.value(31)
    )
    labels = alt.Chart(marks).mark_text(fontSize=10, baseline="bottom").encode(  # coloured by style.readable
        x=alt.X("x:Q", scale=scale), y=alt.value(10), text="label:N"
    )
    return alt.layer(bar, ticks, labels).properties(height=32 + (AXIS_PX if axis else 0))


def fit_bar(in_use: int, predicted_peak: int, wall_at: int, wall_label: str, share: float,
            theme: str | None = None) -> alt.LayerChart:
    """The Run page's "will it fit?" bar: system in use now plus the job's predicted peak,
    against the tightest wall (drawn where it sits in the pool); amber from 80%, red past it."""
    total = in_use + predicted_peak
    color = IN_USE if share <= 0.8 else AMBER if share <= 1.0 else WALL
    bars = pd.DataFrame(
        {
            "part": ["in use now", "predicted peak of this job"],
            "x0": [0.0, in_use / fmt.GIB],
            "x1": [in_use / fmt.GIB, total / fmt.GIB],
            "size": [fmt.gib(in_use), fmt.gib(predicted_peak)],
            "color": [FREE, color],
        }
    )
    top = max(wall_at, total) / fmt.GIB * 1.04
    scale = alt.Scale(domain=[0, top], nice=False)
    bar = alt.Chart(bars).mark_bar(height=20).encode(
        x=alt.X("x0:Q", scale=scale, title="GiB"),
        x2="x1:Q",
        color=alt.Color("color:N", scale=None),
        tooltip=["part:N", "size:N"],
    )
    wall = alt.Chart(pd.DataFrame({"at": [wall_at / fmt.GIB], "label": [wall_label]}))
    rule = wall.mark_rule(color=WALL, strokeDash=[6, 4], strokeWidth=2).encode(x=alt.X("at:Q", scale=scale))
    text = wall.mark_text(color=palette(theme).wall_text, align="right", dx=-4, dy=-20, fontSize=11).encode(
        x=alt.X("at:Q", scale=scale), text="label:N"
    )
    return alt.layer(bar, rule, text).properties(height=80)


def memory_history(frame: pd.DataFrame, total: int, *, height: int = 240) -> alt.Chart:
    """System in use, MemAvailable and MemFree over time (`frame`: time, in_use, available, free in bytes)."""
    labels = {"in_use": "System in use", "available": "MemAvailable", "free": "MemFree"}
    long = frame.melt(id_vars=["time"], value_vars=list(labels), var_name="key", value_name="bytes").dropna(subset=["bytes"])
    long["series"] = long["key"].map(labels)
    long["gib"] = long["bytes"] / fmt.GIB
    long["time"] = pd.to_datetime(long["time"], unit="s")
    color = alt.Scale(domain=list(labels.values()), range=[IN_USE, AVAILABLE, FREE])
    return (
        alt.Chart(long)
        .mark_line(strokeWidth=2, point=len(frame) < 3)
        .encode(
            x=alt.X("time:T", title="last 15 min (jobs' stored samples and this page's readings)",
                    axis=alt.Axis(format="%H:%M:%S", labelOverlap=True)),
            y=alt.Y("gib:Q", title="GiB", scale=alt.Scale(domain=[0, total / fmt.GIB], nice=False)),
            color=alt.Color("series:N", scale=color, legend=alt.Legend(title=None)),
            tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), "series:N", alt.Tooltip("gib:Q", title="GiB", format=".2f")],
        )
        .properties(height=height)
    )


def pressure_history(frame: pd.DataFrame, *, height: int = 200) -> alt.Chart:
    """PSI memory pressure over time (`frame`: time, some, full in percent of the last 10 s)."""
    long = frame.melt(id_vars=["time"], value_vars=["some", "full"], var_name="stall", value_name="percent")
    long["time"] = pd.to_datetime(long["time"], unit="s")
    top = max(5.0, float(long["percent"].max() or 0.0) * 1.2)
    color = alt.Scale(domain=list(PRESSURE_COLORS), range=list(PRESSURE_COLORS.values()))
    return (
        alt.Chart(long)
        .mark_line(strokeWidth=2, point=len(frame) < 3)
        .encode(
            x=alt.X("time:T", title="since this page opened, last 15 min", axis=alt.Axis(format="%H:%M:%S", labelOverlap=True)),
            y=alt.Y("percent:Q", title="% of time stalled", scale=alt.Scale(domain=[0, top], nice=False)),
            color=alt.Color(
                "stall:N", scale=color,
                legend=alt.Legend(title=None, labelExpr="datum.label == 'some' ? 'some tasks stalled (avg10)' : 'all tasks stalled (avg10)'"),
            ),
            tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), "stall:N", alt.Tooltip("percent:Q", format=".2f")],
        )
        .properties(height=height)
    )
