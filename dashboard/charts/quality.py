"""Compare's A/B chart: PSNR and SSIM of B's frames against A's, one small panel each, the worst frame marked."""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

from dashboard.charts.style import palette

QUALITY_COLOR = "#0072B2"
"""The per-frame curve (Okabe-Ito blue)."""
PANELS = (("psnr", "PSNR (dB)"), ("ssim", "SSIM"))
"""The frame metrics drawn, each in its own panel."""


def quality_frame(psnr: list[float], ssim: list[float]) -> pd.DataFrame:
    """Rows (frame, metric, value) for the chart; an identical frame's infinite PSNR is left out (no point drawn)."""
    rows = [{"frame": i, "metric": label, "value": value}
            for name, label in PANELS for i, value in enumerate(psnr if name == "psnr" else ssim)
            if math.isfinite(value)]
    return pd.DataFrame(rows, columns=["frame", "metric", "value"])


def quality_chart(frame: pd.DataFrame, worst: int, *, theme: str | None = None) -> alt.VConcatChart:
    """A panel per metric of `frame` (from `quality_frame`), frames on x, a rule at `worst`."""
    missing = {"frame", "metric", "value"} - set(frame.columns)
    if missing:
        raise ValueError(f"quality_chart needs columns {sorted(missing)}")
    muted = palette(theme).muted
    panels = []
    for _, label in PANELS:
        rows = frame[frame["metric"] == label]
        line = alt.Chart(rows).mark_line(point=len(rows) < 40, color=QUALITY_COLOR).encode(
            x=alt.X("frame:Q", title="frame"),
            y=alt.Y("value:Q", title=label, scale=alt.Scale(zero=False)),
            tooltip=[alt.Tooltip("frame:Q"), alt.Tooltip("value:Q", title=label, format=".4g")],
        )
        rule = alt.Chart(pd.DataFrame({"frame": [worst]})).mark_rule(color=muted, strokeDash=[4, 3]).encode(
            x="frame:Q")
        panels.append((line + rule).properties(height=120, width="container"))
    return alt.vconcat(*panels)
