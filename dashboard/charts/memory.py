"""The Job page's memory chart: stage strip above memory curves, with the wall, the limits
the job ran under, its predicted peak and, when it was killed, where.

Every layer is its own small function of a `Panel` (what all layers of one rank's
panel share), so each is read and tested alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import altair as alt
import pandas as pd

from dashboard import format as fmt
from dashboard import words
from dashboard.charts import frames as fr
from dashboard.charts.style import POLICY, PREDICTED, WALL, BY_LABEL, Palette, palette
from dashboard.format import GIB

POLICY_EVENTS = ("decision", "load", "release")
"""Event kinds drawn as policy rules: offload decisions, and each component loaded or released by a generate job."""
STEP_EVENTS = ("step",)
"""Event kinds drawn as ticks on the stage strip (one per denoising step)."""
MULTI_RANK_WIDTH = 620
"""Panel width when several ranks stack (a concat cannot stretch to its column)."""
CHART_HEIGHT = 380
"""Fixed height of the main memory chart so live refreshes never move the layout."""
STRIP_PX = (-26, -6)
"""Pixel rows of the stage strip: just above the plot area, inside the chart's own layer."""
BAND_OPACITY = (0.22, 0.38)
"""Alternating opacities of stage bands: neighbours stay apart on a light or a dark page."""


def series_color_scale(labels: Sequence[str] | None = None) -> alt.Scale:
    """The fixed colour scale, restricted to `labels` (all series by default)."""
    chosen = [BY_LABEL[label] for label in labels] if labels else list(BY_LABEL.values())
    return alt.Scale(domain=[s.label for s in chosen], range=[s.color for s in chosen])


def stage_strip(
    spans: pd.DataFrame,
    *,
    x_scale: alt.Scale | None = None,
    steps: pd.Series | None = None,
    extent: float | None = None,
    theme: str | None = None,
) -> alt.LayerChart:
    """A 20 px state timeline of stages (neutral bands with labels) drawn above the plot area, one
    tick per denoising step. It is a layer of the memory chart, so it shares the x scale and
    the chart stays one view that stretches to its column. `extent` is the width of the x
    domain: only bands wide enough for their text get a label (see fitting_labels);
    without it the spans' own extent is used. `theme` ("light"/"dark") picks the neutral colours."""
    colors = palette(theme)
    scale = x_scale or alt.Scale(zero=True)
    if extent is None and len(spans):
        extent = float(spans["x1"].max()) - min(0.0, float(spans["x0"].min()))
    said = spans.assign(stage=spans["stage"].map(words.stage).astype(str))  # the stage in words, as pages say it
    shaded = spans.assign(
        shade=[BAND_OPACITY[i % 2] for i in range(len(spans))],
        label=fr.fitting_labels(said, extent),
        said=said["stage"],
    )
    top, bottom = STRIP_PX
    bands = alt.Chart(shaded).mark_rect(stroke=colors.band_edge, strokeWidth=1, color=colors.band).encode(
        x=alt.X("x0:Q", scale=scale),
        x2="x1:Q",
        y=alt.value(top),
        y2=alt.value(bottom),
        opacity=alt.Opacity("shade:Q", scale=None),
        tooltip=[alt.Tooltip("said:N", title="stage"), alt.Tooltip("stage:N", title="recorded as")],
    )
    labels = alt.Chart(shaded[shaded["label"] != ""]).mark_text(fontSize=11, color=colors.text).encode(
        x=alt.X("mid:Q", scale=scale), y=alt.value((top + bottom) / 2), text="label:N"
    )
    layers = [bands, labels]
    if steps is not None and len(steps):
        ticks = alt.Chart(pd.DataFrame({"x": steps.to_numpy()})).mark_rule(color=colors.text, strokeWidth=1).encode(
            x=alt.X("x:Q", scale=scale), y=alt.value(bottom - 6), y2=alt.value(bottom)
        )
        layers.append(ticks)
    return alt.layer(*layers)


@dataclass(frozen=True)
class Panel:
    """What every layer of one rank's panel shares."""

    frames: fr.MemoryFrames
    """The whole chart's frames (series, units)."""
    wide: pd.DataFrame
    """This rank's rows of frames.wide."""
    long: pd.DataFrame
    """This rank's rows of frames.long."""
    x: fr.XAxis
    x_scale: alt.Scale
    x_end: float | None
    """Right end of a fixed x domain (the checkpoint size), else None."""
    y_scale: alt.Scale
    colors: Palette
    key: str
    """Suffix that keeps this panel's selection names unique."""

    @property
    def labels(self) -> list[str]:
        return [s.label for s in self.frames.series]

    @property
    def x_enc(self) -> alt.X:
        unit = self.frames.placed_unit[0]
        axis = _unit_axis(unit) if self.x == "bytes" else alt.Axis()
        return alt.X("x:Q", title=fr.x_title(self.x, unit), scale=self.x_scale, axis=axis)

    @property
    def y_enc(self) -> alt.Y:
        unit = self.frames.y_unit[0]
        title = unit + (" above the job's first sample" if self.frames.baseline else "")
        return alt.Y("value:Q", title=title, scale=self.y_scale, axis=_unit_axis(unit))


def _unit_axis(unit_name: str) -> alt.Axis:
    """Axis ticks: one decimal of GiB, whole MiB, never closer than what the format shows (a 0.05 GiB step
    printed at one decimal would read 0.0, 0.1, 0.1)."""
    return alt.Axis(format=".1f", tickMinStep=0.1) if unit_name == "GiB" else alt.Axis(format=",.0f", tickMinStep=1)


@dataclass(frozen=True)
class Marks:
    """What the chart marks besides the curves (all optional)."""

    capacity: int | None = None
    """Bytes of the device's memory: the wall and the >= 90% danger zone."""
    diagonal: float | None = None
    """Right end of the y = x "model itself" line (above the baseline on a bytes axis)."""
    spans: pd.DataFrame | None = None
    """Stage spans (faint rules at their boundaries)."""
    events: pd.DataFrame | None = None
    """Events with their x: policy decisions become pink rules."""
    limits: pd.DataFrame | None = None
    """Limit lines (fr.limit_rows), the predicted peak among them."""
    kill: str | None = None
    """Label of the kill marker at the last sample ("process killed", "memory guard"), None if not killed."""
    kill_series: str | None = None
    """The series the kill marker sits on; None: the highest one at the last sample."""


def stage_rules(p: Panel, spans: pd.DataFrame | None) -> list:
    if spans is None or len(spans) < 2:
        return []
    return [alt.Chart(spans.iloc[1:]).mark_rule(color=p.colors.muted, strokeWidth=1, opacity=0.5).encode(x=alt.X("x0:Q", scale=p.x_scale))]


def wall_layers(p: Panel, capacity: int | None) -> list:
    """The capacity rule, its label and the danger zone above 90%."""
    if not capacity:
        return []
    cap = capacity / GIB
    zone = alt.Chart(pd.DataFrame({"y0": [cap * 0.9], "y1": [cap], "label": [f"capacity {fmt.gib(capacity)}"]}))
    return [
        zone.mark_rect(color=WALL, opacity=0.08).encode(y=alt.Y("y0:Q", scale=p.y_scale), y2="y1:Q"),
        zone.mark_rule(color=WALL, strokeDash=[6, 4], strokeWidth=1.5).encode(y=alt.Y("y1:Q", scale=p.y_scale)),
        zone.mark_text(color=WALL, align="right", baseline="bottom", dy=-3, fontSize=11).encode(
            y=alt.Y("y1:Q", scale=p.y_scale), x=alt.value("width"), text="label:N"
        ),
    ]


def diagonal_layers(p: Panel, end: float | None) -> list:
    """y = x: above the baseline on the placed axis, the model itself (1.0×)."""
    if not end:
        return []
    model = pd.DataFrame({"x": [0.0, end], "value": [0.0, end], "label": ["", "the model itself (1.0×)"]})
    line = alt.Chart(model).encode(x=alt.X("x:Q", scale=p.x_scale), y=alt.Y("value:Q", scale=p.y_scale))
    return [
        line.mark_line(color="#888", strokeDash=[2, 3], strokeWidth=1.2, opacity=0.7),
        line.mark_text(color=p.colors.muted, align="right", baseline="top", dx=-4, dy=4, fontSize=11).encode(text="label:N"),
    ]


def limit_layers(p: Panel, limits: pd.DataFrame | None) -> list:
    """Each limit as a dashed rule in its series' colour, the predicted peak in gray, labelled at the left in the
    theme's text colour (a label in the series' green or sky blue reads under 4.5:1)."""
    if limits is None or limits.empty:
        return []
    colors = {**{label: BY_LABEL[label].color for label in limits["series"] if label in BY_LABEL}, "predicted": PREDICTED}
    rows = limits.assign(color=limits["series"].map(colors))
    rule = alt.Chart(rows).encode(y=alt.Y("value:Q", scale=p.y_scale))
    return [
        rule.mark_rule(strokeDash=[5, 3], strokeWidth=1.6, clip=True).encode(color=alt.Color("color:N", scale=None), tooltip=["label:N"]),
        rule.mark_text(align="left", baseline="bottom", dx=4, dy=-2, fontSize=11, clip=True, color=p.colors.text).encode(
            x=alt.value(0), text="label:N"
        ),
    ]


def curve_layers(p: Panel, legend_pick, cursor) -> list:
    """The series as step lines (fixed colour, dash and width per series) and the cursor rule."""
    series = p.frames.series
    color = alt.Color("series:N", scale=series_color_scale(p.labels), legend=alt.Legend(title=None, orient="bottom"))
    lines = (
        alt.Chart(p.long)
        .mark_line(interpolate="step-after", clip=True)
        .encode(
            x=p.x_enc,
            y=p.y_enc,
            color=color,
            strokeDash=alt.StrokeDash(
                "series:N", scale=alt.Scale(domain=p.labels, range=[list(s.dash) or [1, 0] for s in series]), legend=None
            ),
            strokeWidth=alt.StrokeWidth("series:N", scale=alt.Scale(domain=p.labels, range=[s.width for s in series]), legend=None),
            opacity=alt.when(legend_pick).then(alt.value(1.0)).otherwise(alt.value(0.15)),
            detail="series:N",
        )
    )
    rule = alt.Chart(p.long).mark_rule(color=p.colors.muted, strokeWidth=1, opacity=0.6).encode(x=p.x_enc).transform_filter(cursor)
    return [lines, rule]


def cursor_points(p: Panel, legend_pick, cursor) -> alt.Chart:
    """Invisible points carrying both selections and the all-series-at-cursor tooltip.

    One layer carries both selections (Altair lifts params of several layers onto every view,
    which Vega rejects as duplicate signals); nearest needs point marks, not lines."""
    y_name = p.frames.y_unit[0] + (" above the job's first sample" if p.frames.baseline else "")
    tooltip = [
        alt.Tooltip("tensor:N", title="tensor"),
        alt.Tooltip("stage:N", title="stage"),
        alt.Tooltip("placed:Q", title=f"{p.frames.placed_unit[0]} placed", format=".2f"),
        alt.Tooltip("t:Q", title="seconds", format=".2f"),
        *[alt.Tooltip(f"{s.label}:Q", title=f"{s.label}, {y_name} ({s.source})", format=".2f") for s in p.frames.series],
        alt.Tooltip("headroom_gib:Q", title="MemAvailable (headroom, GiB)", format=".2f"),
    ]
    return (
        alt.Chart(p.long)
        .mark_point(filled=True, size=36, clip=True)
        .encode(
            x=p.x_enc,
            y=p.y_enc,
            color=alt.Color("series:N", scale=series_color_scale(p.labels), legend=alt.Legend(title=None, orient="bottom")),
            opacity=alt.when(cursor).then(alt.value(1.0)).otherwise(alt.value(0.0)),
            tooltip=tooltip,
        )
        .add_params(legend_pick, cursor)
    )


def policy_layers(p: Panel, events: pd.DataFrame | None) -> list:
    """Policy decisions: a pink rule and a diamond at the top, the decision in the tooltip."""
    if events is None:
        return []
    policy = events[events["kind"].isin(POLICY_EVENTS)]
    if not len(policy):
        return []
    pol = alt.Chart(policy[["x", "t", "message"]])
    return [
        pol.mark_rule(color=POLICY, strokeWidth=1).encode(x=alt.X("x:Q", scale=p.x_scale), tooltip=["message:N"]),
        pol.mark_point(shape="diamond", filled=True, color=POLICY, size=60).encode(
            x=alt.X("x:Q", scale=p.x_scale), y=alt.value(4), tooltip=["message:N", alt.Tooltip("t:Q", format=".2f")]
        ),
    ]


def kill_layers(p: Panel, label: str | None, on: str | None = None) -> list:
    """A kill (the OOM killer's, or the memory guard's): a red rule and ✕ at the last sample,
    and the rest of a fixed x domain grayed as "no data"."""
    if not label or not len(p.wide):
        return []
    last = p.wide.iloc[[-1]]
    drawn = [lab for lab in p.labels if pd.notna(last[lab].iloc[0])]
    top = on if on in drawn else max(drawn, key=lambda lab: float(last[lab].iloc[0])) if drawn else None
    end = p.x_end if p.x_end is not None else float(last["x"].iloc[0])
    kill = pd.DataFrame(
        {"x": last["x"].to_numpy(), "value": [float(last[top].iloc[0]) if top else 0.0], "label": [label], "end": [end]}
    )
    mark = alt.Chart(kill)
    layers = []
    if end > kill["x"].iloc[0]:
        layers.append(mark.mark_rect(color="#9e9e9e", opacity=0.18).encode(x=alt.X("x:Q", scale=p.x_scale), x2="end:Q"))
        layers.append(
            mark.mark_text(color=p.colors.muted, align="left", dx=6, baseline="top", dy=6, text=f"no data — {label}").encode(
                x=alt.X("x:Q", scale=p.x_scale), y=alt.value(0)
            )
        )
    layers.append(mark.mark_rule(color=WALL, strokeWidth=2).encode(x=alt.X("x:Q", scale=p.x_scale)))
    layers.append(
        mark.mark_text(text="✕", color=WALL, fontSize=18, fontWeight="bold").encode(
            x=alt.X("x:Q", scale=p.x_scale), y=alt.Y("value:Q", scale=p.y_scale), tooltip=["label:N"]
        )
    )
    return layers


def panel(p: Panel, marks: Marks, *, strip: alt.LayerChart | None, height: int, title: str | None) -> alt.LayerChart:
    """One rank's panel: every layer, back to front."""
    legend_pick = alt.selection_point(fields=["series"], bind="legend", name=f"mute_{p.key}")
    cursor = alt.selection_point(fields=["x"], nearest=True, on="pointerover", empty=False, clear="pointerout", name=f"cursor_{p.key}")
    layers = [strip] if strip is not None else []
    layers += stage_rules(p, marks.spans)
    layers += wall_layers(p, marks.capacity)
    layers += diagonal_layers(p, marks.diagonal)
    layers += limit_layers(p, marks.limits)
    layers += curve_layers(p, legend_pick, cursor)
    layers += policy_layers(p, marks.events)
    layers += kill_layers(p, marks.kill, marks.kill_series)
    chart = alt.layer(*layers, cursor_points(p, legend_pick, cursor)).properties(height=height)
    return chart.properties(title=title) if title else chart


def _y_scale(fit: fr.Fit, capacity: int | None, peak: float) -> tuple[alt.Scale, int | None]:
    """The y scale and the capacity still worth drawing: none above the baseline (each series
    starts at 0 there), the whole pool for "pool", and for "data" the wall only when near the curves."""
    if fit == "baseline":
        return alt.Scale(zero=True), None
    if fit == "pool" and capacity:
        return alt.Scale(domain=[0, max(capacity / GIB * 1.04, peak * 1.04)]), capacity
    if capacity and peak * 1.25 < capacity / GIB:
        capacity = None  # fitting the data: the wall is far off scale, so leave it out
    return alt.Scale(zero=True), capacity


def _kill_scale(long: pd.DataFrame, limits: pd.DataFrame, series: str) -> tuple[alt.Scale, float] | None:
    """Fitting the data of a job killed by a bound on one series (a memory limit on cgroup usage, the guard's
    budget or floor on System in use): y spans that series and its bounds only, so a host-wide curve far above
    (System in use beside a 2 GiB cgroup) cannot squash what killed the job; other curves are clipped.
    None when that series was not drawn. Returns the scale and its top (y units)."""
    values = long.loc[long["series"] == series, "value"]
    if values.empty:
        return None
    bounds = limits.loc[limits["series"] == series, "value"] if not limits.empty else pd.Series(dtype=float)
    top = max(float(values.max()), float(bounds.max()) if len(bounds) else 0.0) * 1.08
    low = 0.0 if series != "System in use" else max(0.0, min(float(values.min()), *bounds.tolist()) * 0.9)
    return alt.Scale(domain=[low, top], nice=False), top


def _near(limits: pd.DataFrame, fit: fr.Fit, peak: float) -> pd.DataFrame:
    """Limit lines worth drawing: all on the whole pool; fitting the data, those within 1.5× of
    the curves' peak (a far-off floor would flatten them), and the predicted peak always."""
    if fit == "pool" or limits.empty:
        return limits
    return limits[(limits["series"] == "predicted") | (limits["value"] <= max(peak, 1e-9) * 1.5)]


def memory_chart(
    samples: pd.DataFrame,
    *,
    x: fr.XAxis = "bytes",
    total_bytes: int | None = None,
    mem_total: int | None = None,
    capacity: int | None = None,
    fit: fr.Fit = "pool",
    events: pd.DataFrame | None = None,
    killed: bool = False,
    kill_label: str = "process killed",
    kill_series: str | None = None,
    limits: Mapping[str, int | None] | None = None,
    predicted_peak: int | None = None,
    theme: str | None = None,
    height: int = CHART_HEIGHT,
) -> alt.LayerChart | alt.VConcatChart:
    """The Job page's chart: stage strip above memory curves, sharing x (one panel per rank).

    samples: rows with MEMORY_COLUMNS (bytes), optionally tensor_name, rank and cgroup_usage
    (several ranks draw one panel each). total_bytes fixes the x domain of the bytes/percent
    views at the checkpoint size so live refreshes never rescale. mem_total adds "System in
    use"; capacity draws the wall (dashed rule and the >=90% danger zone); fit="pool" scales y
    to the whole pool, "data" to the curves, "baseline" shows each series minus its first
    sample (what the job itself added; no wall) with a faint y = x diagonal, the model itself,
    when x is bytes placed. Bytes read in MiB under 1 GiB. events (columns t, kind, message)
    adds policy decisions (POLICY_EVENTS) as pink rules and denoising steps (STEP_EVENTS) as
    ticks on the stage strip. limits (memory_limit, memory_budget, memory_floor in bytes, as
    in a job spec) draw dashed lines on the series they bound (frames.job_limits); predicted_peak (bytes the forecast said the job would add) a gray dashed line.
    killed marks the last sample with the red kill rule and a cross labelled kill_label; kill_series (the series
    whose bound killed it: "cgroup usage" for a memory limit, "System in use" for the guard) makes fit="data"
    span that series and its bounds, with the cross on it.
    """
    frames = fr.memory_frames(samples, x=x, total_bytes=total_bytes, mem_total=mem_total, baseline=fit == "baseline")
    wide, long = frames.wide, frames.long
    if events is not None:
        fr.require(events, ("t", "kind", "message"), "memory chart events")
    domain = fr.x_domain(x, total_bytes, frames.placed_unit[1])
    x_scale = alt.Scale(domain=domain) if domain else alt.Scale(zero=True)
    peak = float(long["value"].max()) if len(long) else 0.0
    y_scale, capacity = _y_scale(fit, capacity, peak)
    bounds = fr.job_limits(limits or {}, mem_total, frames.starts.get("System in use"))
    rows = fr.limit_rows(bounds, frames, predicted=predicted_peak)
    scaled = _kill_scale(long, rows, kill_series) if killed and kill_series and fit == "data" else None
    if scaled is not None:
        y_scale, top = scaled
        capacity = capacity if capacity and capacity / GIB <= top else None
        rows = rows[rows["value"] <= top]
    spans = fr.stage_spans(samples, wide["x"])
    ex = fr.event_x(events, samples, x, total_bytes, frames.placed_unit[1]) if events is not None and len(events) else None
    extent = (domain[1] - domain[0]) if domain else (float(wide["x"].max()) - min(0.0, float(wide["x"].min())) if len(wide) else None)
    steps = ex[events["kind"].isin(STEP_EVENTS)] if ex is not None else None
    strip = stage_strip(spans, x_scale=x_scale, steps=steps, extent=extent, theme=theme) if len(spans) else None
    x_end = domain[1] if domain else None
    marks = Marks(
        capacity=capacity,
        diagonal=(x_end or (float(wide["x"].max()) if len(wide) else None)) if fit == "baseline" and x == "bytes" else None,
        spans=spans,
        events=events.assign(x=ex) if ex is not None else None,
        limits=rows if scaled is not None else _near(rows, fit, peak),
        kill=kill_label if killed else None,
        kill_series=kill_series if scaled is not None else None,
    )
    ranks = sorted(wide["rank"].unique()) if len(wide) else [0]
    panels = [
        panel(
            Panel(frames, wide[wide["rank"] == r] if len(wide) else wide, long[long["rank"] == r] if len(long) else long,
                  x, x_scale, x_end, y_scale, palette(theme), f"r{r}"),
            marks,
            strip=strip,
            height=height if len(ranks) == 1 else max(180, height // len(ranks)),
            title=f"rank {r}" if len(ranks) > 1 else None,
        )
        for r in ranks
    ]
    if len(panels) == 1:
        return panels[0]
    return alt.vconcat(*[p.properties(width=MULTI_RANK_WIDTH) for p in panels], spacing=36).resolve_scale(x="shared")
