"""bench/bench_peers.py's case options and its goals table (the GPU host runs the cases themselves)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_peers  # noqa: E402


def test_kvikio_and_stream_unregistered_take_options_and_a_wrong_key_is_named():
    assert bench_peers.parse_case("kvikio[threads=16,task_size=16MiB,compat=on,direct=true]") == (
        "kvikio", {"threads": 16, "task_size": 16 << 20, "compat": "ON", "direct": True})
    assert bench_peers.parse_case("stream_unregistered[staging_buffers=12]") == ("stream_unregistered", {"staging_buffers": 12})
    with pytest.raises(argparse.ArgumentTypeError, match="kvikio takes threads, task_size, compat, direct, bounce, not 'nthreads'"):
        bench_peers.parse_case("kvikio[nthreads=4]")
    with pytest.raises(argparse.ArgumentTypeError, match="compat='maybe'"):
        bench_peers.parse_case("kvikio[compat=maybe]")


def _row(case: str, cache: str, gbps: float, **extra) -> dict:
    return {"case": case, "options": extra.pop("options", {}), "cache": cache, "gbps": gbps, **extra}


def test_the_goals_are_ratios_of_medians_and_say_which_are_missed():
    rows = [_row("ceil_h2d", "warm", 55.0)]
    for a, b, c in ((48.0, 45.0, 42.0), (49.0, 50.0, 42.5), (47.0, 44.0, 41.0)):  # one round behind
        rows += [_row("stream", "warm", a), _row("instanttensor_buffered", "warm", b), _row("stream_unregistered", "warm", c)]
    rows += [_row("stream", "tmpfs", 49.0, footprint_ratio=1.01), _row("instanttensor", "tmpfs", 48.0),
             _row("ceil_direct", "cold", 2.0), _row("ceil_direct_seq", "cold", 1.6), _row("stream", "cold", 1.9),
             _row("kvikio", "warm", 24.0, options={"threads": 16})]
    lines = {line.split(" | ")[0].lstrip("| "): line for line in bench_peers.format_goals(rows).splitlines()[2:]}
    assert lines["warm: stream / pinned h2d ceiling"] == "| warm: stream / pinned h2d ceiling | 0.873 | >= 0.88 | NO |"
    assert lines["warm: rounds stream ahead of instanttensor_buffered (2 of 3)"].endswith("| 0.667 | >= 1.00 | NO |")
    assert lines["tmpfs: stream / instanttensor default (mmap)"].endswith("| 1.021 | >= 1.00 | yes |")
    assert lines["tmpfs: stream / instanttensor_mmap"].endswith("| not measured | >= 1.00 | |")
    assert lines["tmpfs: stream footprint"].endswith("| 1.010 | <= 1.02 | yes |")
    assert lines["cold: stream / best raw O_DIRECT read"].endswith("| 0.950 | >= 0.98 | NO |")
    assert lines["warm: registration refused / registered"].endswith("| 0.875 | >= 0.85 | yes |")
    assert lines["warm: kvikio[threads=16] / stream"].endswith("| 0.500 | (peer) | |")
