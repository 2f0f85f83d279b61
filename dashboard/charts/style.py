"""How every chart draws: the fixed series colours and the neutral colours of each theme.

Series colours are Okabe-Ito (colour-blind safe) and fixed per series, so a
curve looks the same on every page. Red (WALL) means only the wall (capacity)
or a kill. Neutral marks (stage bands, labels, rules) come from the page's
theme, so the stage strip and bars read in dark mode too.
"""

from __future__ import annotations

from dataclasses import dataclass

WALL = "#D55E00"
"""The capacity rule, the danger zone and the kill marker; nothing else is red."""
POLICY = "#CC79A7"
"""Policy-decision rules and diamonds."""
PREDICTED = "#7F7F7F"
"""The forecast's predicted peak (dashed): context for the measured curve, not a measurement."""


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
    """Fixed colour."""
    dash: tuple[int, ...]
    """Stroke dash; empty is solid."""
    width: float
    """Stroke width in px."""


SERIES: tuple[Series, ...] = (
    Series("system_in_use", "System in use", "/proc/meminfo (MemTotal − MemAvailable)", "#009E73", (), 2.5),
    Series("vm_rss", "VmRSS", "worker /proc status", "#0072B2", (), 1.8),
    Series("rss_file", "RssFile", "worker /proc status (file-backed part of VmRSS, reclaimable)", "#56B4E9", (6, 4), 1.8),
    Series("device_allocated", "GPU allocated", "torch allocator", "#E69F00", (), 1.8),
    Series("cgroup_usage", "cgroup usage", "the job's memory cgroup (what a memory limit enforces)", "#8E6BB8", (2, 2), 2.0),
)
"""Every memory series, in legend order (and Compare's fixed panel order)."""

OWN = Series(
    "own", "Job's own memory",
    "VmRSS growth + GPU allocated growth since the job's first sample, over bytes placed: what the footprint ratio measures",
    "#CC79A7", (), 2.5,
)
"""Compare's first panel: the job's own memory, normalised as the footprint ratio is (docs/metrics.md)."""
HOST_WIDE = frozenset({"System in use"})
"""Series that measure the whole machine, not the job: Compare titles their panels so."""

BY_LABEL = {s.label: s for s in (*SERIES, OWN)}


@dataclass(frozen=True)
class Palette:
    """Neutral colours of one theme."""

    text: str
    """Labels drawn on the chart (stage names, end-of-line labels)."""
    muted: str
    """Rules at stage boundaries, step ticks, the cursor rule."""
    band: str
    """Stage bands (drawn with alternating opacity, so neighbours stay apart)."""
    band_edge: str
    """The gap between stage bands: the page background."""
    free: str
    """The free part of the memory bar."""
    cache: str
    """The page-cache part of the memory bar."""
    wall_text: str
    """The wall's label: its red, darkened on the light theme so the text reads at 4.5:1."""


PALETTES = {
    "light": Palette(text="#333333", muted="#666666", band="#9a9a9a", band_edge="#ffffff", free="#ececec", cache="#b9d7ea",
                     wall_text="#B34E00"),
    "dark": Palette(text="#e6e6e6", muted="#9a9a9a", band="#8a8a8a", band_edge="#0e1117", free="#31333f", cache="#3d6f8f",
                    wall_text=WALL),
}
"""Neutral colours per Streamlit theme type (`st.context.theme.type`)."""


def palette(theme: str | None) -> Palette:
    """The palette of a theme type; anything unknown (None before the browser reports) reads light."""
    return PALETTES.get(theme or "light", PALETTES["light"])


JOB_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9")
"""One Okabe-Ito colour per compared job (in the order they are compared), never the wall's red: on Compare a job
keeps its colour in every panel, and the panel's title names the series."""


def readable(chart, theme: str | None):
    """`chart` with its axis, legend and panel titles in the theme's text colour and its other text (a text mark
    given no colour) in the muted one: Streamlit's chart theme draws axis labels at 3.7:1 on the light background,
    under WCAG AA's 4.5:1 for text (the figures are in .streamlit/config.toml)."""
    colors = palette(theme)
    text = {"labelColor": colors.text, "titleColor": colors.text}
    return (chart.configure_axis(**text).configure_legend(**text).configure_header(**text)
            .configure_title(color=colors.text).configure_text(color=colors.muted))
