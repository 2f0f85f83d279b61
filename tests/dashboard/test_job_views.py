"""The Job page's words and cards, as plain functions of made-up rows."""

from __future__ import annotations

import pandas as pd
import pytest

from dashboard.host import memory_kind, pool_caption
from dashboard.views import jobs as jv
from loader.device import DeviceInfo

GIB = 2**30


def _device(kind: str, unified: bool) -> DeviceInfo:
    return DeviceInfo(kind, kind, 0 if kind == "cuda" else None, kind, unified, 8 * GIB, kind, "test")


def test_generate_cards_show_steps_with_seconds_per_step_and_the_peak_stage(load_samples):
    job = {"kind": "generate", "status": "succeeded", "progress_done": 8, "progress_total": 8,
           "metrics": {"peak_footprint": GIB, "stage_peaks": {"conditioning": GIB, "denoising": GIB // 2},
                       "stage_seconds": {"denoising": 4.0}}}
    cards = {c.label: c for c in jv.metric_cards(job, jv.live_stats(load_samples, 24 * GIB), total_bytes=GIB, capacity=24 * GIB)}
    assert list(cards) == ["Denoising steps", "Peak system in use", "Peak footprint", "Min headroom", "Peak VmRSS"]
    assert (cards["Denoising steps"].value, cards["Denoising steps"].delta) == ("8/8", "0.50 s/step")
    assert (cards["Peak footprint"].value, cards["Peak footprint"].delta) == ("1.00 GiB", "in conditioning")
    assert "conditioning 1.00 GiB · denoising 0.50 GiB" in cards["Peak footprint"].help


def test_a_running_generate_job_measures_steps_from_when_denoising_started(load_samples):
    job = {"kind": "generate", "status": "running", "stage": "denoising", "progress_done": 2, "progress_total": 10, "metrics": None}
    events = pd.DataFrame({"t": [0.5, 9.9], "kind": ["stage_start", "stage_start"], "stage": ["conditioning", "denoising"]})
    stats = jv.live_stats(load_samples, 24 * GIB)  # last sample at t = 11.9
    cards = {c.label: c for c in jv.metric_cards(job, stats, total_bytes=None, capacity=None, events=events)}
    assert cards["Denoising steps"].delta == "1.00 s/step"
    # Live peak footprint: max of VmRSS + device allocated, and the stage it happened in.
    assert cards["Peak footprint"].value == "2.25 GiB"
    assert cards["Peak footprint"].delta == "in load"
    assert "placed" not in jv.status_label(job, stats, GIB)


def test_before_denoising_the_steps_card_says_nothing_rather_than_zero(load_samples):
    job = {"kind": "generate", "status": "running", "progress_done": None, "progress_total": None}
    cards = jv.metric_cards(job, jv.live_stats(load_samples, None), total_bytes=None, capacity=None)
    assert (cards[0].value, cards[0].delta) == ("—", None)


def test_load_cards_keep_placement_and_footprint_ratio(load_samples):
    job = {"kind": "load", "status": "succeeded", "metrics": {"footprint_ratio": 1.2}}
    labels = [c.label for c in jv.metric_cards(job, jv.live_stats(load_samples, 24 * GIB), total_bytes=2 * GIB, capacity=24 * GIB)]
    assert labels[:3] == ["Placed", "Peak system in use", "Footprint ratio"]


@pytest.mark.parametrize(
    ("devices", "caption"),
    [
        ([_device("cpu", True)], "host memory"),
        ([_device("cpu", True), _device("cuda", False)], "host memory"),
        ([_device("cpu", True), _device("cuda", True)], "unified memory: GPU and CPU share this pool"),
    ],
)
def test_the_memory_bar_says_unified_only_when_a_probed_gpu_is(devices, caption):
    assert pool_caption(devices) == caption


def test_a_cpu_job_runs_in_host_memory():
    assert memory_kind(_device("cpu", True)) == "host memory"
    assert memory_kind(_device("cuda", False)) == "discrete memory"
    assert memory_kind(_device("cuda", True)) == "unified memory"
