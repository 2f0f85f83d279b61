"""A placement mode and a dtype are each one registration (docs/extending.md): a throwaway one, registered here
and nowhere else, reaches every command's help, the Run page's form and fit panel, the forecast, the submit check,
History, Compare and a retry's offer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from loader.placement import Placement, PlacementCost, register_placement

ROOT = Path(__file__).resolve().parents[2]


class TricklePlacement(Placement):
    """A made-up mode: one bounce buffer of the largest tensor, through mmap views."""

    summary = "copies each tensor through one bounce buffer"
    typical_footprint = 1.5
    uses_mmap = True
    glyph = "┄"
    dash = (1, 3)

    def forecast_cost(self, component, targets, device) -> PlacementCost:
        return PlacementCost(staging=max(meta.nbytes for meta, _ in targets))


@pytest.fixture
def trickle(monkeypatch):
    """The made-up mode registered for one test, the registry as it was afterwards."""
    from loader.placement import base

    monkeypatch.setattr(base, "_PLACEMENTS", dict(base._PLACEMENTS))
    return register_placement("trickle")(TricklePlacement)


@pytest.fixture
def float64():
    """`float64` (`fp64`, `double`) registered for one test, the vocabulary as it was afterwards."""
    from core import dtype_names

    aliases, short = dict(dtype_names.DTYPE_ALIASES), dict(dtype_names._SHORT)
    dtype_names.register_dtype("float64", "fp64", "double")
    yield "float64"
    dtype_names.DTYPE_ALIASES.clear()
    dtype_names.DTYPE_ALIASES.update(aliases)
    dtype_names._SHORT.clear()
    dtype_names._SHORT.update(short)


def _help(build_parser, *argv: str) -> str:
    parser = build_parser()
    for name in argv:
        parser = next(a for a in parser._actions if a.dest in ("command", "kind")).choices[name]
    return parser.format_help()


def _run_page() -> AppTest:
    return AppTest.from_file(str(ROOT / "dashboard" / "pages" / "run.py"), default_timeout=60)


def test_a_registered_mode_is_in_every_commands_help(trickle):
    from jobs.cli import build_parser as jobs_parser
    from loader.cli import build_parser as loader_parser

    described = "trickle: copies each tensor through one bounce buffer; about 1.5×"
    assert described in " ".join(_help(jobs_parser, "submit", "load").split())
    assert described in " ".join(_help(loader_parser, "load").split())


def test_a_registered_mode_forecasts_itself_and_the_fit_panel_lists_it(trickle, tiny_checkpoint, data_dir):
    from dashboard.views import fit
    from loader.forecast import forecast_load
    from machine.device import DeviceInfo

    cpu = DeviceInfo(spec="cpu", kind="cpu", index=None, name="cpu", unified_memory=False, total_memory=None,
                     source="test", reason="test")
    forecast = forecast_load(tiny_checkpoint, mode="trickle", device_info=cpu)
    assert forecast.staging_bytes == 256 * 128 * 4  # the largest tensor, as its forecast_cost says
    assert forecast.predicted_peak_bytes == forecast.model_bytes + forecast.staging_bytes
    peaks = fit.load_peaks(str(tiny_checkpoint), component=None, dtype=None, device=cpu, roots=[data_dir / "models"])
    assert peaks["trickle"] == forecast.predicted_peak_bytes and set(peaks) == {"drain", "retain", "stream", "trickle"}


def test_a_registered_mode_is_offered_by_the_run_page_and_queued(trickle, fresh_db, tiny_checkpoint):
    at = _run_page().run()
    assert "trickle" in at.segmented_control(key="run_mode").options
    at.segmented_control(key="run_mode").set_value("trickle").run()
    assert not at.exception, at.exception
    assert any(c.value == TricklePlacement.describe() for c in at.caption)
    at.button(key="run_submit").click().run()
    queued = [json.loads(row[0]) for row in fresh_db.execute("SELECT spec FROM jobs").fetchall()]
    assert [spec["mode"] for spec in queued] == ["trickle"]


def test_history_compare_a_retry_and_the_unified_memory_warning_read_the_modes_facts(trickle):
    from dashboard.charts import job_dashes
    from dashboard.views import outcome
    from dashboard.views.history import mode_label
    from loader.placement.advice import mode_warning
    from machine.device import DeviceInfo
    import pandas as pd

    assert mode_label("trickle") == "┄ trickle"
    dashes = job_dashes(pd.DataFrame({"job": ["#1 trickle", "#2 stream"], "mode": ["trickle", "stream"], "job_id": [1, 2]}))
    assert dashes["#1 trickle"] == [1, 3]
    oom = {"status": "killed", "spec": {"mode": "retain"}, "error": "killed (SIGKILL), most likely by the kernel OOM killer"}
    assert outcome.retry_choices(oom) == ["same settings", "stream", "drain", "trickle"]
    assert outcome.retry_choices({**oom, "spec": {"mode": "trickle"}}) == ["same settings", "stream", "drain"]
    assert outcome.retry_changes("trickle", None) == {"mode": "trickle"}
    spark = DeviceInfo("cuda:0", "cuda", 0, "NVIDIA GB10", True, 128 << 30, "test", "a fake device")
    assert "mode trickle reads through mmap views" in mode_warning("trickle", spark)


def test_a_registered_dtype_is_in_the_help_the_run_form_and_the_loader(float64, fresh_db, tiny_checkpoint):
    import torch

    from jobs.cli import build_parser as jobs_parser
    from loader.dtypes import parse_dtype

    help_text = " ".join(_help(jobs_parser, "submit", "load").split())
    assert "bfloat16, float16, float32 or float64 (bf16, fp16, fp32, fp64 too)" in help_text
    assert parse_dtype("double") is torch.float64
    at = _run_page().run()
    assert at.selectbox(key="run_dtype").options[-1] == "float64"
    at.selectbox(key="run_dtype").set_value("float64").run()
    at.button(key="run_submit").click().run()
    assert not at.exception, at.exception
    queued = [json.loads(row[0]) for row in fresh_db.execute("SELECT spec FROM jobs").fetchall()]
    assert [spec["dtype"] for spec in queued] == ["float64"]
