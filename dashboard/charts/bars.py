"""Horizontal bars: the Run page's "will it fit?" forecast and the shared memory pool bar."""

from __future__ import annotations

import altair as alt
import pandas as pd

from dashboard.charts.style import WALL
from dashboard.format import GIB

POOL_FREE = "#9a9a9a"
"""The free part of the pool bar: a neutral gray drawn translucent, so it reads on a light or a dark page."""
POOL_CACHE = "#56B4E9"
"""The page-cache part (RssFile's colour: file-backed, reclaimable), translucent likewise."""


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
    threshold ticks at 80% and 90% (named in their tooltip). Neutral parts are
    translucent, so the bar follows a light or dark page."""
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
            "color": [used_color, POOL_CACHE, POOL_FREE],
            "opacity": [1.0, 0.45, 0.25],
        }
    )
    scale = alt.Scale(domain=[0, total_gib])
    bar = alt.Chart(parts).mark_bar(height=height - 12).encode(
        x=alt.X("x0:Q", scale=scale, title=None, axis=alt.Axis(format=".0f", labelExpr="datum.label + ' GiB'") if axis else None),
        x2="x1:Q",
        color=alt.Color("color:N", scale=None),
        opacity=alt.Opacity("opacity:Q", scale=None),
        tooltip=["part:N", alt.Tooltip("gib:Q", title="GiB", format=".2f")],
    )
    marks = alt.Chart(pd.DataFrame({"x": [total_gib * 0.8, total_gib * 0.9], "label": ["80%", "90%"]})).mark_tick(
        color="#888888", thickness=2, size=height - 8
    ).encode(x=alt.X("x:Q", scale=scale), tooltip=[alt.Tooltip("label:N", title="threshold")])
    return alt.layer(bar, marks).properties(height=height)
