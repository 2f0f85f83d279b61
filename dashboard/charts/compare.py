"""The Compare page's overlay: small multiples, one panel per series, jobs told apart by dash."""

from __future__ import annotations

from typing import Literal

import altair as alt
import pandas as pd

from dashboard.charts import frames as fr
from dashboard.charts.style import HOST_WIDE, JOB_COLORS, OWN, SERIES, WALL, palette
from dashboard.format import GIB

JOB_DASHES = [[1, 0], [8, 4], [4, 3], [1, 3], [8, 3, 1, 3]]
"""Dash patterns that tell up to five compared jobs apart (solid, long, short, dot, dash-dot)."""
MAX_COMPARED = len(JOB_DASHES)
"""The Compare overlay draws at most this many jobs."""


def mode_dashes() -> dict[str, list[int]]:
    """Each placement mode's own dash (`Placement.dash`): the first job of each mode always draws with it,
    whatever else is compared."""
    from loader.placement import placement_classes

    return {cls.name: list(cls.dash) for cls in placement_classes() if cls.dash}


def job_dashes(jobs: pd.DataFrame) -> dict[str, list[int]]:
    """label -> dash for rows (job, mode, job_id): each mode keeps its dash (the lowest id of a
    mode gets it); the other jobs take, in id order, the patterns of no mode first (so a second
    drain job never looks like a retain one), then those of modes not compared. It depends
    only on which jobs are compared, never on the order they were picked in."""
    rows = jobs.drop_duplicates("job").sort_values("job_id")
    by_mode = mode_dashes()
    dashes: dict[str, list[int]] = {}
    for row in rows.itertuples():
        dash = by_mode.get(row.mode)
        if dash is not None and dash not in dashes.values():
            dashes[row.job] = dash
    modes = list(by_mode.values())
    spare = [d for d in JOB_DASHES if d not in modes] + [d for d in modes if d not in dashes.values()]
    for row in rows.itertuples():
        if row.job not in dashes:
            dashes[row.job] = spare.pop(0)
    return dashes


def _dashes(samples: pd.DataFrame, jobs: list[str]) -> list[list[int]]:
    """The dash of each of `jobs`: by mode when the samples carry mode and job_id, else by order."""
    if {"mode", "job_id"} <= set(samples.columns) and len(samples):
        by_job = job_dashes(samples[["job", "mode", "job_id"]])
        return [by_job[j] for j in jobs]
    return JOB_DASHES[: max(1, len(jobs))]


def panel_title(label: str) -> str:
    """A panel's title: host-wide series say they are the whole machine, not the job."""
    return f"{label} (whole machine)" if label in HOST_WIDE else label


def compare_chart(
    samples: pd.DataFrame,
    *,
    x: Literal["percent", "seconds"] = "percent",
    y: Literal["gib", "ratio"] = "gib",
    subtract_start: bool = False,
    capacity: int | None = None,
    fit: Literal["pool", "data"] = "data",
    theme: str | None = None,
) -> alt.FacetChart:
    """Small multiples, one panel per series in a fixed order (titled by the series), the job's own
    memory first (normalised as the footprint ratio is) and host-wide panels after it, each job in one
    colour in every panel (JOB_COLORS, in the order compared), with a dash pattern (fixed per mode, see
    job_dashes) and an end-of-line label; at most five jobs.

    y="ratio" adds reference rules at 1.0× and 2.0×. `job` labels should be
    short and unique (e.g. "#7 drain"); optional columns mode and job_id fix each job's dash.
    """
    frame = fr.compare_frame(samples, x=x, y=y, subtract_start=subtract_start)
    jobs = list(dict.fromkeys(frame["job"])) if len(frame) else list(dict.fromkeys(samples.get("job", [])))
    if len(jobs) > MAX_COMPARED:
        raise ValueError(f"compare draws at most {MAX_COMPARED} jobs; got {len(jobs)}")
    colors = palette(theme)
    chosen = [s for s in (OWN, *SERIES) if s.label in set(frame["series"])] or [SERIES[1]]
    frame["series"] = frame["series"].map(panel_title)
    labels = [panel_title(s.label) for s in chosen]
    frame["end"] = ~frame.duplicated(["job", "series"], keep="last")
    frame["label_y"] = fr.end_label_positions(frame)
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
        y=alt.Y("value:Q", title=y_title, scale=y_scale, axis=alt.Axis(format=".2f", tickMinStep=0.01) if y == "ratio"
                   else alt.Axis(format=".1f", tickMinStep=0.1)),
        color=alt.Color("job:N", scale=alt.Scale(domain=jobs or [""], range=list(JOB_COLORS[:max(1, len(jobs))])),
                        legend=alt.Legend(title="job", orient="top")),
        strokeDash=alt.StrokeDash("job:N", scale=alt.Scale(domain=jobs or [""], range=_dashes(samples, jobs)),
                                  legend=alt.Legend(title="job", orient="top")),
        opacity=alt.when(pick).then(alt.value(1.0)).otherwise(alt.value(0.35)),
        detail="job:N",
        tooltip=[
            alt.Tooltip("job:N"),
            alt.Tooltip("series:N"),
            alt.Tooltip("x:Q", title="% placed" if x == "percent" else "seconds", format=".1f"),
            alt.Tooltip("value:Q", title=y_title, format=".2f"),
        ],
    ).add_params(pick)
    ends = base.transform_filter(alt.datum.end).mark_text(align="left", dx=4, fontSize=10, color=colors.text).encode(
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
