"""The machine's bars: the pool split the way the kernel counts it, labelled ticks, the fit bar's colours."""

from __future__ import annotations

import pandas as pd
import pytest

from dashboard.charts import host as hc
from dashboard.host import HostMemory

GIB = 2**30


def _host(total=24, free=4, available=16, cached=11) -> HostMemory:
    return HostMemory(total=total * GIB, free=free * GIB, available=available * GIB, cached=cached * GIB,
                      swap_total=0, swap_free=0)


def _layer_data(spec: dict, index: int) -> list[dict]:
    return spec["datasets"][spec["layer"][index]["data"]["name"]]


def test_the_pool_splits_into_in_use_reclaimable_cache_and_memfree_that_add_up_to_the_total():
    parts = hc.pool_parts(_host()).set_index("part")
    assert parts.loc["system in use", "bytes"] == 8 * GIB
    assert parts.loc["page cache (reclaimable)", "bytes"] == 12 * GIB  # MemAvailable − MemFree
    assert parts.loc["MemFree", "bytes"] == 4 * GIB
    assert parts["bytes"].sum() == 24 * GIB
    assert parts["x1"].iloc[-1] == pytest.approx(24.0)


@pytest.mark.parametrize("available, color", [(16, hc.IN_USE), (4, hc.AMBER), (1, hc.WALL)])
def test_in_use_turns_amber_from_80_percent_and_red_from_90(available, color):
    parts = hc.pool_parts(_host(free=0, available=available)).set_index("part")
    assert parts.loc["system in use", "color"] == color


def test_the_threshold_ticks_carry_their_labels_with_or_without_an_axis():
    for axis in (True, False):
        spec = hc.pool_bar(_host(), axis=axis).to_dict()
        labels = [row["label"] for row in _layer_data(spec, 2)]
        assert labels == ["80%", "90%"]
        assert spec["layer"][2]["mark"]["type"] == "text"
        x = spec["layer"][0]["encoding"]["x"]
        assert ("axis" in x and x["axis"] is None) == (not axis)


@pytest.mark.parametrize("share, color", [(0.5, hc.IN_USE), (0.9, hc.AMBER), (1.2, hc.WALL)])
def test_the_fit_bar_is_green_amber_or_red_by_share_of_the_wall(share, color):
    spec = hc.fit_bar(4 * GIB, 2 * GIB, 8 * GIB, "limit 8.00 GiB", share).to_dict()
    rows = _layer_data(spec, 0)
    assert rows[1]["color"] == color
    assert _layer_data(spec, 2)[0]["label"] == "limit 8.00 GiB"


def test_pressure_history_plots_some_and_full_in_percent():
    frame = pd.DataFrame({"time": [1.0e9, 1.0e9 + 5], "some": [0.5, 12.0], "full": [0.0, 3.0]})
    spec = hc.pressure_history(frame).to_dict()
    rows = spec["datasets"][spec["data"]["name"]]
    assert sorted({r["stall"] for r in rows}) == ["full", "some"]
    assert spec["encoding"]["y"]["scale"]["domain"] == [0, pytest.approx(14.4)]
