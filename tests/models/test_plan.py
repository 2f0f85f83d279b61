"""`--plan fastest` on `tiny`: every candidate forecast against a real wall and timed from a faked history; the
fastest that fits is chosen, one that cannot fit is marked with its stage, lossy levers only when allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from machine.device import DeviceInfo
from machine.offload import OffloadSettings
from models.eta import StageRecord, stage_work
from models.forecast import forecast_generate
from models.levers import lever_key
from models.params import GenerateParams
from models.plan import PRECISIONS, candidate_settings, machine_check, plan_fastest, plan_lines, planned

CPU = DeviceInfo(spec="cpu", kind="cpu", index=None, name="test CPU", unified_memory=False, total_memory=None,
                 source="test", reason="tests")
KEY = "cpu:test CPU"
PARAMS = GenerateParams(prompt="a red fox in the snow", height=64, width=64, steps=8, audio=False)


def _forecaster(root: Path):
    def forecast_for(params: GenerateParams, sequential: bool):
        return forecast_generate(root, params, device_info=CPU, settings=OffloadSettings(),
                                 sequential_components=sequential)
    return forecast_for


def _history(root: Path, rates: dict[str, float]) -> list[StageRecord]:
    """Records of past runs: for each lever set, `rate` seconds per unit of work on every stage (residency is no
    lever: its runs time both)."""
    forecast_for = _forecaster(root)
    records = []
    for key, rate in rates.items():
        values = dict(item.split("=") if "=" in item else (item, True) for item in key.split("+") if item)
        forecast = forecast_for(GenerateParams(**{**PARAMS.to_dict(), **values}), False)
        records += [StageRecord(stage, work * rate, work, KEY, key) for stage, work in stage_work(forecast).items()]
    return records


def _plan(root: Path, records, available: int = 2**40, **kwargs):
    return plan_fastest(PARAMS, device="cpu", capability=None, device_key=KEY, forecast_for=_forecaster(root),
                        check=machine_check("cpu", False, None, "test CPU", available), records=records, **kwargs)


def test_lossless_candidates_on_a_cpu_are_the_backends_it_runs_compile_off_and_on_and_both_residencies():
    found = candidate_settings(PARAMS, "cpu", None, lossy=False, sequential=None)
    assert {(s, v["attention"], v["compile"]) for s, v in found} == {
        (s, a, c) for s in (False, True) for a in ("native", "_native_flash") for c in (False, True)}
    assert all(v["quantize"] is None and v["step_cache"] is None for _, v in found)
    asked = {"attention": "native", "compile": False, "quantize": None, "step_cache": None}
    assert found[:2] == [(False, asked), (True, asked)]  # the request first, resident before sequential
    assert [sum(v[k] != asked[k] for k in asked) for _, v in found] == [0, 0, 1, 1, 1, 1, 2, 2]


def test_lossy_levers_are_candidates_only_when_allowed(monkeypatch: pytest.MonkeyPatch):
    import models.quantize_check as check

    monkeypatch.setattr(check, "torchao_installed", lambda: True)
    found = candidate_settings(PARAMS, "cpu", None, lossy=True, sequential=True)
    assert {v["step_cache"] for _, v in found} == {None, "taylorseer"}
    assert {v["quantize"] for _, v in found} == {None, "int8"}  # fp8 and fp8 compute need CUDA 8.9
    h200 = candidate_settings(PARAMS, "cuda:0", (9, 0), lossy=True, sequential=True)
    assert {v["quantize"] for _, v in h200} == set(PRECISIONS)


def test_the_plan_picks_the_fastest_that_fits_by_history(h3_tiny: Path):
    records = _history(h3_tiny, {"": 1e-6, "attention=_native_flash": 5e-7})
    plan = _plan(h3_tiny, records)
    assert all(c.fits for c in plan.candidates)
    forecast_for = _forecaster(h3_tiny)
    for c in plan.candidates:  # the plan forecasts once per residency and precision: the same numbers
        direct = forecast_for(GenerateParams(**{**PARAMS.to_dict(), **c.levers}), c.sequential)
        assert c.peaks == {s.stage: s.total_bytes for s in direct.stages} and c.not_counted == direct.not_counted
    timed = [c for c in plan.candidates if c.seconds is not None]
    assert len(timed) == 4  # both residencies of two lever sets; compile's have no history: never assumed faster
    chosen = plan.choice
    assert (chosen.sequential, chosen.levers["attention"], chosen.levers["compile"]) == (False, "_native_flash", False)
    assert chosen.seconds == min(c.seconds for c in timed) < min(c.seconds for c in timed
                                                                 if c.levers["attention"] == "native")
    assert plan.why.startswith("the fastest of 4 that fit with history on this machine") \
        and "4 that fit have no history" in plan.why
    params, sequential = planned(PARAMS, plan)
    assert (params.attention, params.compile, sequential) == ("_native_flash", False, False)


def test_a_candidate_over_the_wall_is_marked_with_its_stage_and_the_fastest_that_fits_is_taken(h3_tiny: Path):
    forecast_for = _forecaster(h3_tiny)
    resident, sequential = (forecast_for(PARAMS, s) for s in (False, True))
    # MemAvailable between the two residencies' peaks: only sequential fits.
    assert sequential.predicted_peak_bytes < resident.predicted_peak_bytes
    available = resident.process_host_bytes + (sequential.predicted_peak_bytes + resident.predicted_peak_bytes) // 2
    records = _history(h3_tiny, {"": 1e-6, "attention=_native_flash": 5e-7})
    plan = _plan(h3_tiny, records, available)
    refused = [c for c in plan.candidates if not c.fits]
    assert refused and all(not c.sequential for c in refused)
    assert refused[0].over_stage == resident.peak_stage and "over the" in refused[0].wall
    assert all(" under the " in c.wall for c in plan.candidates if c.fits)
    assert (plan.choice.sequential, plan.choice.levers["attention"]) == (True, "_native_flash")
    lines = plan_lines(plan.to_dict())
    assert any(line.startswith(" x resident") and "does not fit:" in line for line in lines)
    assert sum(line.startswith(" * ") for line in lines) == 1


def test_without_history_the_order_of_preference_decides_keeping_to_the_request_and_says_so(h3_tiny: Path):
    plan = _plan(h3_tiny, [])
    assert plan.chosen == 0 and "no history on this machine for any candidate that fits" in plan.why
    assert plan.choice.levers == {"attention": "native", "compile": False, "quantize": None, "step_cache": None}
    assert "no speedup is assumed without history" in plan.why


def test_when_nothing_fits_nothing_is_chosen_and_the_line_names_the_stage(h3_tiny: Path):
    plan = _plan(h3_tiny, [], available=2**20)
    assert plan.choice is None and plan.why.startswith("no candidate fits: ") and "MemAvailable" in plan.why
    with pytest.raises(ValueError, match="no candidate fits"):
        planned(PARAMS, plan)


def test_history_of_one_lever_set_never_times_another(h3_tiny: Path):
    from models.eta import estimate

    records = _history(h3_tiny, {"compile": 1e-6})
    work = stage_work(_forecaster(h3_tiny)(PARAMS, False))
    etas = {e.stage: e.seconds for e in estimate(work, records, KEY, lever_key({}))}
    assert etas["denoise.denoise"] is None and etas["text_encoder"] is not None
