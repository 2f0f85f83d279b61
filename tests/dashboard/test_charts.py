"""Chart builders are pure functions: read their Vega-Lite dicts."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dashboard import charts

GIB = 2**30


def _layers(spec: dict) -> list[dict]:
    """Every unit spec under a (v/h)concat/layer/facet tree."""
    found = []
    stack = [spec]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "mark" in node:
                found.append(node)
            for key in ("vconcat", "hconcat", "layer", "concat"):
                stack.extend(node.get(key, []))
            if "spec" in node:
                stack.append(node["spec"])
    return found


def _datasets(spec: dict) -> dict[str, list[dict]]:
    return spec.get("datasets", {})


def _line_layer(spec: dict) -> dict:
    return next(layer for layer in _layers(spec) if (layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"]) == "line")


def test_memory_chart_draws_each_series_in_its_fixed_colour(load_samples):
    spec = charts.memory_chart(load_samples, mem_total=24 * GIB).to_dict()
    color = _line_layer(spec)["encoding"]["color"]
    assert color["field"] == "series"
    assert color["scale"]["domain"] == ["System in use", "VmRSS", "RssFile"]
    assert color["scale"]["range"] == ["#009E73", "#0072B2", "#56B4E9"]
    dash = _line_layer(spec)["encoding"]["strokeDash"]["scale"]
    assert dash["range"][dash["domain"].index("RssFile")] == [6, 4]


def test_gpu_allocated_appears_only_when_a_device_allocated_memory(load_samples, sample_frame):
    cpu = charts.memory_chart(load_samples).to_dict()
    gpu = charts.memory_chart(sample_frame(gpu=True)).to_dict()
    assert "GPU allocated" not in _line_layer(cpu)["encoding"]["color"]["scale"]["domain"]
    assert _line_layer(gpu)["encoding"]["color"]["scale"]["domain"][-1] == "GPU allocated"
    assert _line_layer(gpu)["encoding"]["color"]["scale"]["range"][-1] == "#E69F00"


def test_bytes_axis_is_fixed_to_the_checkpoint_size_in_gib(load_samples):
    spec = charts.memory_chart(load_samples, x="bytes", total_bytes=3 * GIB).to_dict()
    x = _line_layer(spec)["encoding"]["x"]
    assert x["title"] == "GiB placed"
    assert x["scale"]["domain"] == [0, 3.0]
    values = [row["value"] for row in _datasets(spec)[_line_layer(spec)["data"]["name"]]]
    # VmRSS ends at 0.25 GiB baseline + 2 GiB placed.
    assert max(values) == pytest.approx(2.25, abs=0.01)


def test_percent_axis_needs_the_checkpoint_size(load_samples):
    with pytest.raises(ValueError, match="total_bytes"):
        charts.memory_chart(load_samples, x="percent")
    spec = charts.memory_chart(load_samples, x="percent", total_bytes=2 * GIB).to_dict()
    assert _line_layer(spec)["encoding"]["x"]["scale"]["domain"] == [0, 100]


def test_system_in_use_is_memtotal_minus_memavailable(load_samples):
    spec = charts.memory_chart(load_samples, x="seconds", mem_total=24 * GIB).to_dict()
    rows = _datasets(spec)[_line_layer(spec)["data"]["name"]]
    first_in_use = next(r["value"] for r in rows if r["series"] == "System in use")
    assert first_in_use == pytest.approx(24 - 20 + 2 / 96, abs=1e-6)


def test_fitting_the_data_leaves_out_a_wall_far_off_scale(load_samples):
    far = charts.memory_chart(load_samples, capacity=100 * GIB, fit="data").to_dict()
    near = charts.memory_chart(load_samples, capacity=int(2.5 * GIB), fit="data").to_dict()
    assert "capacity 100.0 GiB" not in json.dumps(far)
    assert "capacity 2.5 GiB" in json.dumps(near)


def test_capacity_draws_a_dashed_red_wall_with_a_label_and_danger_zone(load_samples):
    spec = charts.memory_chart(load_samples, capacity=24 * GIB, fit="pool").to_dict()
    layers = _layers(spec)
    rules = [l for l in layers if l["mark"].get("type") == "rule" and l["mark"].get("color") == charts.WALL]
    assert rules and rules[0]["mark"]["strokeDash"] == [6, 4]
    texts = [l for l in layers if l["mark"].get("type") == "text" and l["mark"].get("color") == charts.WALL]
    assert texts and texts[0]["mark"]["align"] == "right"
    zone = [l for l in layers if l["mark"].get("type") == "rect" and l["mark"].get("color") == charts.WALL]
    assert zone and zone[0]["mark"]["opacity"] == pytest.approx(0.08)
    assert "capacity 24.0 GiB" in json.dumps(spec, ensure_ascii=False)


def test_tooltip_names_the_tensor_and_every_series_in_gib_with_two_decimals(load_samples):
    spec = charts.memory_chart(load_samples, mem_total=24 * GIB).to_dict()
    hover = next(l for l in _layers(spec) if "tooltip" in l.get("encoding", {}) and l["mark"].get("type") == "point")
    titles = [t["title"] for t in hover["encoding"]["tooltip"]]
    assert titles[0] == "tensor"
    assert "VmRSS, GiB (worker /proc status)" in titles
    assert all(t.get("format") == ".2f" for t in hover["encoding"]["tooltip"] if t["type"] == "quantitative")
    row = _datasets(spec)[hover["data"]["name"]][0]
    assert {"VmRSS", "RssFile", "System in use", "tensor"} <= set(row)


def test_selections_live_on_one_layer_so_vega_gets_each_signal_once(load_samples):
    spec = charts.memory_chart(load_samples, mem_total=24 * GIB).to_dict()
    for param in spec.get("params", []):
        assert len(param.get("views", [])) == 1, param


def test_stage_strip_has_one_band_per_stage_run_with_labels(load_samples):
    spans = charts.stage_spans(load_samples, load_samples["t"])
    assert list(spans["stage"]) == ["load", "denoising"]
    assert spans["x1"].iloc[0] == spans["x0"].iloc[1]
    spec = charts.memory_chart(load_samples, x="seconds").to_dict()
    strip = spec["layer"][0]
    bands = next(l for l in strip["layer"] if l["mark"]["type"] == "rect")
    assert (bands["encoding"]["y"]["value"], bands["encoding"]["y2"]["value"]) == charts.STRIP_PX
    data_name = (bands.get("data") or strip["data"])["name"]
    assert [r["stage"] for r in _datasets(spec)[data_name]] == ["load", "denoising"]
    assert any(l["mark"]["type"] == "text" for l in strip["layer"])


def test_denoising_steps_are_ticks_on_the_strip_not_bands(load_samples):
    events = pd.DataFrame({"t": [10.0, 10.5, 11.0], "kind": ["step"] * 3, "message": ["1/3", "2/3", "3/3"]})
    spec = charts.memory_chart(load_samples, x="seconds", events=events).to_dict()
    strip = spec["layer"][0]
    ticks = [l for l in strip["layer"] if l["mark"]["type"] == "rule"]
    assert len(ticks) == 1
    assert [r["x"] for r in _datasets(spec)[ticks[0]["data"]["name"]]] == [10.0, 10.5, 11.0]


def test_policy_events_land_at_the_bytes_placed_when_they_happened(load_samples):
    events = pd.DataFrame({"t": [4.8], "kind": ["release"], "message": ["released transformer (20.0 MiB)"]})
    spec = charts.memory_chart(load_samples, x="bytes", events=events).to_dict()
    diamonds = [l for l in _layers(spec) if l["mark"].get("shape") == "diamond"]
    assert diamonds and diamonds[0]["mark"]["color"] == charts.POLICY
    row = _datasets(spec)[diamonds[0]["data"]["name"]][0]
    placed = load_samples.loc[load_samples["t"] <= 4.8, "bytes_placed"].iloc[-1] / GIB
    assert row["x"] == pytest.approx(placed)


def test_a_killed_job_gets_a_red_rule_and_cross_at_its_last_sample(load_samples):
    cut = load_samples.iloc[:50]
    spec = charts.memory_chart(cut, x="bytes", total_bytes=2 * GIB, killed=True).to_dict()
    crosses = [l for l in _layers(spec) if l["mark"].get("text") == "✕"]
    assert crosses and crosses[0]["mark"]["color"] == charts.WALL
    kill_row = _datasets(spec)[crosses[0]["data"]["name"]][0]
    assert kill_row["x"] == pytest.approx(cut["bytes_placed"].iloc[-1] / GIB)
    assert "no data — process killed" in json.dumps(spec, ensure_ascii=False)


def test_several_ranks_draw_one_panel_each(sample_frame):
    spec = charts.memory_chart(sample_frame(ranks=2), x="seconds").to_dict()
    assert [p.get("title") for p in spec["vconcat"]] == ["rank 0", "rank 1"]


def test_missing_columns_are_named_in_the_error(load_samples):
    with pytest.raises(ValueError, match="rss_file, mem_available"):
        charts.memory_chart(load_samples.drop(columns=["rss_file", "mem_available"]))
    with pytest.raises(ValueError, match="total_bytes"):
        charts.compare_chart(load_samples.assign(job="a", mem_total=None))


def test_empty_frames_give_valid_empty_charts(load_samples):
    empty = load_samples.iloc[:0]
    spec = charts.memory_chart(empty, x="bytes", total_bytes=GIB, capacity=8 * GIB, killed=True).to_dict()
    assert spec["layer"]
    compare = charts.compare_chart(empty.assign(job="a", total_bytes=GIB, mem_total=None)).to_dict()
    assert compare["facet"]["field"] == "series"


@pytest.fixture
def two_jobs(sample_frame) -> pd.DataFrame:
    """A retain job and a stream job whose VmRSS is half of retain's, both of a 2 GiB checkpoint."""
    retain = sample_frame().assign(job="#1 retain", total_bytes=2 * GIB, mem_total=24 * GIB)
    stream = sample_frame().assign(job="#2 stream", total_bytes=2 * GIB, mem_total=24 * GIB)
    stream["vm_rss"] = stream["vm_rss"] // 2
    return pd.concat([retain, stream], ignore_index=True)


def test_compare_gives_each_job_one_colour_and_dash_and_each_series_a_panel(two_jobs):
    spec = charts.compare_chart(two_jobs).to_dict()
    line = _line_layer(spec)
    assert line["encoding"]["strokeDash"]["scale"]["domain"] == ["#1 retain", "#2 stream"]
    assert line["encoding"]["strokeDash"]["scale"]["range"] == charts.JOB_DASHES[:2]
    assert line["encoding"]["color"]["field"] == "job"
    assert line["encoding"]["color"]["scale"] == {"domain": ["#1 retain", "#2 stream"], "range": ["#0072B2", "#E69F00"]}
    # The job's own memory leads, then System in use (titled the whole machine), then VmRSS.
    assert spec["facet"]["field"] == "series"
    assert spec["facet"]["sort"][:3] == ["Job's own memory", "System in use (whole machine)", "VmRSS"]


def test_compare_leads_with_the_jobs_own_memory_normalised_as_the_footprint_ratio(two_jobs):
    frame = charts.compare_frame(two_jobs, x="percent", y="ratio", subtract_start=True)
    own = frame[(frame["job"] == "#1 retain") & (frame["series"] == "Job's own memory")]
    part = two_jobs[two_jobs["job"] == "#1 retain"].sort_values("t")
    grown = (part["vm_rss"] - part["vm_rss"].iloc[0]) + (part["device_allocated"] - part["device_allocated"].iloc[0])
    assert own["value"].max() == pytest.approx(grown.max() / (2 * GIB))  # docs/metrics.md's footprint_ratio
    # A job's recorded footprint (its load report's) is the number its label quotes: the one Job page and History show.
    recorded = charts.compare_frame(two_jobs.assign(footprint=1.16), x="percent", y="ratio", subtract_start=True)
    labels = set(recorded.loc[recorded["series"] == "Job's own memory", "label"])
    assert labels == {"#1 retain footprint 1.16×", "#2 stream footprint 1.16×"}


def test_compare_leaves_the_process_start_up_out_of_a_loads_curves(sample_frame):
    """A load's first sample is taken as its process starts (no bytes placed yet), hundreds of MiB below the
    first placement; divided by the few bytes placed first it drew 1,400×. From the first placement on, the
    ratios tell the footprint story (1.0× the model itself, about 2× for retain)."""
    jobs = []
    for name, growth in (("#1 stream", 1.0), ("#2 retain", 2.0)):
        part = sample_frame(n=100).assign(job=name, total_bytes=2 * GIB, mem_total=24 * GIB)
        part = part[part["stage"] == "load"].copy()
        part["vm_rss"] = GIB // 2 + (part["bytes_placed"] * growth).astype("int64")
        start = part.iloc[:1].assign(t=-5.0, stage="probe", bytes_placed=None, vm_rss=GIB // 5)
        jobs.append(pd.concat([start, part], ignore_index=True))
    frame = charts.compare_frame(pd.concat(jobs, ignore_index=True), x="percent", y="ratio", subtract_start=True)
    for name, growth in (("#1 stream", 1.0), ("#2 retain", 2.0)):
        own = frame[(frame["job"] == name) & (frame["series"] == "Job's own memory")]
        rss = frame[(frame["job"] == name) & (frame["series"] == "VmRSS")]
        assert own["value"].max() == pytest.approx(growth, rel=0.03)
        assert rss["value"].max() == pytest.approx(growth, rel=0.03)
        assert frame.loc[frame["job"] == name, "x"].notna().all()


def test_compare_x_is_the_fraction_of_each_jobs_model_placed(two_jobs):
    frame = charts.compare_frame(two_jobs, x="percent", y="gib", subtract_start=False)
    assert frame["x"].max() == pytest.approx(100)


def test_compare_ratio_view_divides_by_checkpoint_size_and_draws_reference_rules(two_jobs):
    frame = charts.compare_frame(two_jobs, x="percent", y="ratio", subtract_start=True)
    retain_rss = frame[(frame["job"] == "#1 retain") & (frame["series"] == "VmRSS")]
    # Placed 2 GiB of a 2 GiB checkpoint with VmRSS growing by exactly that: 1.0x above the start.
    assert retain_rss["value"].iloc[-1] == pytest.approx(1.0 - 1 / 96, abs=1e-6)
    spec = charts.compare_chart(two_jobs, y="ratio", subtract_start=True).to_dict()
    refs = [l["encoding"]["y"]["datum"] for l in _layers(spec) if l["mark"].get("type") == "rule"]
    assert sorted(refs) == [1.0, 2.0]


def test_compare_refuses_more_than_five_jobs(sample_frame):
    frames = [sample_frame(10).assign(job=f"#{i}", total_bytes=GIB, mem_total=None) for i in range(6)]
    with pytest.raises(ValueError, match="at most 5 jobs"):
        charts.compare_chart(pd.concat(frames))


def _line_rows(spec: dict) -> list[dict]:
    return _datasets(spec)[_line_layer(spec)["data"]["name"]]


def test_above_baseline_starts_every_series_at_zero_and_draws_the_model_diagonal(load_samples):
    spec = charts.memory_chart(load_samples, x="bytes", total_bytes=2 * GIB, mem_total=24 * GIB, fit="baseline").to_dict()
    rows = _line_rows(spec)
    for label in ("System in use", "VmRSS", "RssFile"):
        values = [r["value"] for r in rows if r["series"] == label]
        assert values[0] == 0.0
    # VmRSS grows by exactly what is placed (2 GiB minus the first sample's share), so it runs along y = x.
    assert max(r["value"] for r in rows if r["series"] == "VmRSS") == pytest.approx(2 - 2 / 96, abs=1e-6)
    assert _line_layer(spec)["encoding"]["y"]["title"] == "GiB above the job's first sample"
    diagonal = next(l for l in _layers(spec) if l["mark"].get("type") == "line" and l["mark"].get("color") == "#888")
    assert [(r["x"], r["value"]) for r in _datasets(spec)[diagonal["data"]["name"]]] == [(0.0, 0.0), (2.0, 2.0)]
    assert "the model itself (1.0×)" in json.dumps(spec, ensure_ascii=False)
    assert "capacity" not in json.dumps(charts.memory_chart(load_samples, capacity=int(2.5 * GIB), fit="baseline").to_dict())


def test_the_model_diagonal_appears_only_above_baseline_on_a_bytes_axis(load_samples):
    for chart in (
        charts.memory_chart(load_samples, x="bytes", total_bytes=2 * GIB, fit="data"),
        charts.memory_chart(load_samples, x="seconds", fit="baseline"),
    ):
        assert "the model itself" not in json.dumps(chart.to_dict(), ensure_ascii=False)


def test_a_checkpoint_under_one_gib_reads_in_mib_on_the_bytes_axis(load_samples):
    small = load_samples.assign(bytes_placed=load_samples["bytes_placed"] // 32)  # 64 MiB in all
    spec = charts.memory_chart(small, x="bytes", total_bytes=64 * 2**20, fit="baseline").to_dict()
    x = _line_layer(spec)["encoding"]["x"]
    assert x["title"] == "MiB placed"
    assert x["scale"]["domain"] == [0, 64.0]
    assert x["axis"]["format"] == ",.0f"
    assert max(r["x"] for r in _line_rows(spec)) == pytest.approx(64.0)
    # Above the baseline, y reads in the same unit so the diagonal is y = x.
    assert _line_layer(spec)["encoding"]["y"]["title"].startswith("MiB")
    big = charts.memory_chart(load_samples, x="bytes", total_bytes=2 * GIB).to_dict()
    assert _line_layer(big)["encoding"]["x"]["title"] == "GiB placed"


def test_only_stage_bands_wide_enough_for_their_text_are_labelled():
    spans = pd.DataFrame(
        {
            "stage": ["input preparation", "conditioning", "latent preparation", "denoising", "decoding"],
            "x0": [0.0, 0.01, 1.3, 1.31, 6.6],
            "x1": [0.01, 1.3, 1.31, 6.6, 6.7],
        }
    ).assign(mid=lambda f: (f["x0"] + f["x1"]) / 2)
    labels = charts.fitting_labels(spans, extent=7.0)
    assert list(labels) == ["", "conditioning", "", "denoising", ""]
    # Where only part of the name fits, it is cut short rather than run into its neighbours.
    assert list(charts.fitting_labels(spans, extent=7.0, width_px=300)) == ["", "condit…", "", "denoising", ""]
    spec = charts.stage_strip(spans, extent=7.0).to_dict()
    bands = next(l for l in spec["layer"] if l["mark"]["type"] == "rect")
    text = next(l for l in spec["layer"] if l["mark"]["type"] == "text")
    assert len(_datasets(spec)[bands["data"]["name"]]) == 5  # every band keeps its tooltip
    assert [r["label"] for r in _datasets(spec)[text["data"]["name"]]] == ["conditioning", "denoising"]
    assert [t["field"] for t in bands["encoding"]["tooltip"]] == ["said", "stage"]  # words, then the recorded name
    said = charts.stage_strip(spans.assign(stage=["probe", "text_encoder", "x", "encode", "y"]), extent=7.0).to_dict()
    text = next(l for l in said["layer"] if l["mark"]["type"] == "text")
    assert [r["label"] for r in _datasets(said)[text["data"]["name"]]] == ["encoding the …", "writing the video"]


def test_compare_ratio_view_labels_each_line_with_its_peak(two_jobs):
    frame = charts.compare_frame(two_jobs, x="percent", y="ratio", subtract_start=True)
    retain = frame[(frame["job"] == "#1 retain") & (frame["series"] == "VmRSS")]
    assert set(retain["label"]) == {f"#1 retain peak {retain['value'].max():.2f}×"}
    assert set(charts.compare_frame(two_jobs, x="percent", y="gib", subtract_start=False)["label"]) == {"#1 retain", "#2 stream"}


def test_end_labels_of_lines_ending_close_together_are_pushed_apart(two_jobs):
    close = two_jobs.copy()
    close.loc[close["job"] == "#2 stream", "vm_rss"] = close.loc[close["job"] == "#1 retain", "vm_rss"].to_numpy()
    frame = charts.compare_frame(close, x="percent", y="gib", subtract_start=False)
    frame["end"] = ~frame.duplicated(["job", "series"], keep="last")
    positions = charts.end_label_positions(frame)[frame["end"] & (frame["series"] == "VmRSS")]
    span = frame["value"].max() - min(0.0, frame["value"].min())
    assert abs(positions.iloc[0] - positions.iloc[1]) >= charts.LABEL_GAP * span - 1e-9
    spec = charts.compare_chart(close).to_dict()
    ends = next(l for l in _layers(spec) if l["mark"].get("type") == "text")
    assert ends["encoding"]["y"]["field"] == "label_y"


def test_panel_order_is_the_same_in_every_view(two_jobs):
    orders = {
        (x, y, subtract): charts.compare_chart(two_jobs, x=x, y=y, subtract_start=subtract).to_dict()["facet"]["sort"]
        for x in ("percent", "seconds") for y in ("gib", "ratio") for subtract in (False, True)
    }
    assert set(map(tuple, orders.values())) == {("Job's own memory", "System in use (whole machine)", "VmRSS", "RssFile")}


def _dash_of(spec: dict) -> dict[str, list]:
    scale = _line_layer(spec)["encoding"]["strokeDash"]["scale"]
    return dict(zip(scale["domain"], scale["range"]))


def test_each_mode_keeps_its_dash_whatever_order_the_jobs_were_picked_in(two_jobs):
    tagged = two_jobs.assign(mode=two_jobs["job"].str.split().str[1], job_id=two_jobs["job"].str[1].astype(int))
    reversed_pick = pd.concat([tagged[tagged["job"] == "#2 stream"], tagged[tagged["job"] == "#1 retain"]])
    for frame in (tagged, reversed_pick):
        dashes = _dash_of(charts.compare_chart(frame).to_dict())
        assert dashes == {"#1 retain": charts.mode_dashes()["retain"], "#2 stream": charts.mode_dashes()["stream"]}
    # A stream job compared with other jobs still draws stream's dash.
    alone = tagged.assign(job=tagged["job"].replace({"#1 retain": "#1 drain"}), mode=tagged["mode"].replace({"retain": "drain"}))
    assert _dash_of(charts.compare_chart(alone).to_dict())["#2 stream"] == charts.mode_dashes()["stream"]


def test_two_jobs_of_one_mode_get_different_dashes_by_id():
    jobs = pd.DataFrame({"job": ["#9 drain", "#4 drain", "#5 stream"], "mode": ["drain", "drain", "stream"], "job_id": [9, 4, 5]})
    dashes = charts.job_dashes(jobs)
    assert dashes["#4 drain"] == charts.mode_dashes()["drain"]
    assert dashes["#5 stream"] == charts.mode_dashes()["stream"]
    assert dashes["#9 drain"] not in charts.mode_dashes().values()


def _with_cgroup(samples: pd.DataFrame) -> pd.DataFrame:
    return samples.assign(cgroup_usage=samples["vm_rss"] - samples["rss_file"] // 2)


def test_a_job_in_a_memory_cgroup_plots_its_usage_and_the_limit_as_a_line(load_samples):
    spec = charts.memory_chart(
        _with_cgroup(load_samples), x="bytes", total_bytes=2 * GIB, fit="pool", capacity=24 * GIB,
        limits={"memory_limit": 3 * GIB},
    ).to_dict()
    assert "cgroup usage" in _line_layer(spec)["encoding"]["color"]["scale"]["domain"]
    rules = [l for l in _layers(spec) if l["mark"].get("type") == "rule" and l["mark"].get("strokeDash") == [5, 3]]
    rows = _datasets(spec)[rules[0]["data"]["name"]]
    assert [(r["label"], r["value"], r["color"]) for r in rows] == [("memory limit 3.00 GiB", 3.0, "#8E6BB8")]
    # Without a cgroup there is neither the series nor a line for it.
    plain = charts.memory_chart(load_samples, limits={"memory_limit": 3 * GIB}).to_dict()
    assert "cgroup usage" not in json.dumps(plain)


def test_budget_and_floor_bound_system_in_use_above_its_start(load_samples):
    limits = charts.job_limits({"memory_budget": GIB, "memory_floor": 4 * GIB}, 24 * GIB, starts_in_use=4 * GIB)
    assert [(l.series, l.nbytes / GIB) for l in limits] == [("System in use", 5.0), ("System in use", 20.0)]
    spec = charts.memory_chart(load_samples, x="bytes", total_bytes=2 * GIB, mem_total=24 * GIB, fit="baseline",
                               limits={"memory_budget": GIB, "memory_floor": 4 * GIB}).to_dict()
    rules = [l for l in _layers(spec) if l["mark"].get("type") == "rule" and l["mark"].get("strokeDash") == [5, 3]]
    rows = _datasets(spec)[rules[0]["data"]["name"]]
    # Above the baseline the budget sits at what the job may add over its first sample; the floor,
    # 16 GiB further up, is far off a 2 GiB curve and left out.
    assert [(r["label"], r["value"]) for r in rows] == [("memory budget 1.00 GiB over the start", pytest.approx(1.0))]


def test_the_predicted_peak_is_a_dashed_gray_line_beside_the_measured_curve(load_samples):
    spec = charts.memory_chart(load_samples, x="bytes", total_bytes=2 * GIB, fit="baseline", predicted_peak=int(2.5 * GIB)).to_dict()
    text = next(l for l in _layers(spec) if l["mark"].get("type") == "text" and l.get("encoding", {}).get("text", {}).get("field") == "label"
                and any(r.get("series") == "predicted" for r in _datasets(spec)[l["data"]["name"]]))
    row = next(r for r in _datasets(spec)[text["data"]["name"]] if r["series"] == "predicted")
    assert row["value"] == pytest.approx(2.5) and row["color"] == charts.PREDICTED
    assert row["label"] == "predicted peak +2.50 GiB"


def test_a_memory_guard_kill_is_drawn_like_an_oom_kill_and_says_who(load_samples):
    spec = charts.memory_chart(load_samples.iloc[:50], x="bytes", total_bytes=2 * GIB, killed=True, kill_label="memory guard").to_dict()
    crosses = [l for l in _layers(spec) if l["mark"].get("text") == "✕"]
    assert crosses and crosses[0]["mark"]["color"] == charts.WALL
    assert _datasets(spec)[crosses[0]["data"]["name"]][0]["label"] == "memory guard"
    assert "no data — memory guard" in json.dumps(spec, ensure_ascii=False)


def test_the_stage_strip_follows_the_theme(load_samples):
    def strip_colours(theme):
        spec = charts.memory_chart(load_samples, x="seconds", theme=theme).to_dict()
        band = next(l for l in _layers(spec) if l["mark"].get("type") == "rect" and "stroke" in l["mark"])
        text = next(l for l in _layers(spec) if l["mark"].get("type") == "text" and l["encoding"]["text"]["field"] == "label")
        return band["mark"]["stroke"], text["mark"]["color"]

    light, dark = strip_colours("light"), strip_colours("dark")
    assert light == ("#ffffff", "#333333")
    assert dark == ("#0e1117", "#e6e6e6")


def _killed_generate(n: int = 60) -> pd.DataFrame:
    """A generate job on a busy 64 GiB box, killed at its 2 GiB memory limit while denoising: System in use
    sits near 40 GiB, the job's own cgroup climbs to the limit."""
    i = pd.RangeIndex(n)
    grow = (i + 1) * (2 * GIB // n)
    return pd.DataFrame({
        "rank": 0, "t": i * 0.5, "stage": ["text_encoder"] * (n // 2) + ["denoise.denoise"] * (n - n // 2),
        "bytes_placed": 0, "tensor_name": None, "vm_rss": GIB // 2 + grow, "rss_file": GIB // 8, "rss_anon": grow,
        "vm_hwm": GIB // 2 + grow, "mem_available": 24 * GIB - grow, "device_allocated": 0, "device_reserved": 0,
        "cgroup_usage": GIB // 4 + grow,
    })


def _y_domains(spec: dict) -> list:
    return [l["encoding"]["y"]["scale"].get("domain") for l in _layers(spec)
            if "scale" in l.get("encoding", {}).get("y", {})]


def test_fitting_the_data_of_a_job_killed_at_its_limit_scales_to_the_cgroup_not_the_whole_machine():
    samples = _killed_generate()
    limit = 2 * GIB + GIB // 4
    spec = charts.memory_chart(samples, x="seconds", mem_total=64 * GIB, capacity=64 * GIB, fit="data", killed=True,
                               kill_series="cgroup usage", limits={"memory_limit": limit},
                               predicted_peak=30 * GIB).to_dict()
    top = limit / GIB * 1.08
    domains = _y_domains(spec)
    assert domains and all(d == [0.0, pytest.approx(top)] for d in domains), domains
    rules = [l for l in _layers(spec) if l["mark"].get("type") == "rule" and l["mark"].get("strokeDash") == [5, 3]]
    labels = [r["label"] for r in _datasets(spec)[rules[0]["data"]["name"]]]
    assert labels == ["memory limit 2.25 GiB"]  # the 30 GiB prediction is off this scale and left out
    cross = next(l for l in _layers(spec) if l["mark"].get("text") == "✕")
    assert _datasets(spec)[cross["data"]["name"]][0]["value"] == pytest.approx(float(samples["cgroup_usage"].iloc[-1]) / GIB)
    # The same job not killed (or no series named) keeps the zero-based scale over every curve.
    plain = charts.memory_chart(samples, x="seconds", mem_total=64 * GIB, fit="data", limits={"memory_limit": limit}).to_dict()
    assert all(d is None for d in _y_domains(plain))


def test_axis_ticks_are_never_closer_than_their_format_shows(two_jobs, load_samples):
    """A 0.05 GiB step printed at one decimal reads 0.0, 0.1, 0.1: each axis keeps a step its format can show."""
    compare = charts.compare_chart(two_jobs, y="gib").to_dict()
    axis = _line_layer(compare)["encoding"]["y"]["axis"]
    assert (axis["format"], axis["tickMinStep"]) == (".1f", 0.1)
    ratio = _line_layer(charts.compare_chart(two_jobs, y="ratio").to_dict())["encoding"]["y"]["axis"]
    assert (ratio["format"], ratio["tickMinStep"]) == (".2f", 0.01)
    spec = charts.memory_chart(load_samples, x="bytes", total_bytes=2 * GIB).to_dict()
    y_axes = [l["encoding"]["y"].get("axis") for l in _layers(spec) if "y" in l.get("encoding", {})
              and l["encoding"]["y"].get("field") == "value" and l["encoding"]["y"].get("axis")]
    assert y_axes and all(a.get("tickMinStep") in (0.1, 1) for a in y_axes)
