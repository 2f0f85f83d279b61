"""`--plan fastest` on `tiny`: every candidate forecast against a real wall and timed from a faked history; the
fastest that fits is chosen, one that cannot fit is marked with its stage, lossy levers only when allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from machine.device import DeviceInfo
from machine.offload import OffloadSettings
from models.forecast.eta import NO_HISTORY, StageRecord, stage_work
from models.forecast import forecast_generate
from models.speed.levers import lever_key
from models.request.params import GenerateParams
from models.speed.levers import COMPILE_STAGE, VAE_COMPILE_STAGE
from models.speed.plan import (PRECISIONS, candidate_settings, machine_check, plan_fastest, plan_lines, planned,
                         startup_words)
from machine.walls import verdict

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


def _plan(root: Path, records, available: int = 2**40, startup: int | None = None, **kwargs):
    return plan_fastest(PARAMS, device="cpu", capability=None, device_key=KEY, forecast_for=_forecaster(root),
                        check=machine_check("cpu", False, None, "test CPU", available, startup or 0), records=records,
                        startup=startup_words(startup, "median of 1 past job" if startup else NO_HISTORY), **kwargs)


def test_lossless_candidates_on_a_cpu_are_the_backends_it_runs_both_compiles_off_and_on_and_both_residencies():
    found = candidate_settings(PARAMS, "cpu", None, lossy=False, sequential=None)
    assert {(s, v["attention"], v["compile"], v["vae_compile"]) for s, v in found} == {
        (s, a, c, d) for s in (False, True) for a in ("native", "_native_flash") for c in (False, True)
        for d in (False, True)}
    assert all(v["quantize"] is None and v["step_cache"] is None for _, v in found)
    asked = {"attention": "native", "compile": False, "quantize": None, "step_cache": None, "vae_compile": False}
    assert found[:2] == [(False, asked), (True, asked)]  # the request first, resident before sequential
    assert [sum(v[k] != asked[k] for k in asked) for _, v in found] == [0, 0, *[1] * 6, *[2] * 6, 3, 3]


def test_a_device_that_cannot_compile_has_no_compiled_candidate(monkeypatch: pytest.MonkeyPatch):
    import models.speed.levers as levers

    monkeypatch.setattr(levers, "triton_installed", lambda: False)
    found = candidate_settings(PARAMS, "cuda:0", (9, 0), lossy=False, sequential=True)
    assert found and not any(v["compile"] or v["vae_compile"] for _, v in found)
    monkeypatch.setattr(levers, "triton_installed", lambda: True)
    found = candidate_settings(PARAMS, "cuda:0", (9, 0), lossy=False, sequential=True)
    assert {(v["compile"], v["vae_compile"]) for _, v in found} == {
        (c, d) for c in (False, True) for d in (False, True)}


def test_lossy_levers_are_candidates_only_when_allowed(monkeypatch: pytest.MonkeyPatch):
    import models.quantization.check as check

    monkeypatch.setattr(check, "torchao_installed", lambda: True)
    found = candidate_settings(PARAMS, "cpu", None, lossy=True, sequential=True)
    assert {v["step_cache"] for _, v in found} == {None, "taylorseer"}
    assert {v["quantize"] for _, v in found} == {None, "int8"}  # fp8 and fp8 compute need CUDA 8.9
    h200 = candidate_settings(PARAMS, "cuda:0", (9, 0), lossy=True, sequential=True)
    assert {v["quantize"] for _, v in h200} == set(PRECISIONS)
    from dataclasses import replace

    parallel = candidate_settings(replace(PARAMS, parallel=2), "cpu", None, lossy=True, sequential=True)
    assert {(v["compile"], v["step_cache"]) for _, v in parallel} == {(False, None)}  # not with --parallel yet


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
    # Neither compile has history: their 12 candidates are not compared.
    assert plan.why.startswith("the fastest of 4 that fit with history on this machine") \
        and "12 that fit have no history" in plan.why
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
    assert plan.choice.levers == {"attention": "native", "compile": False, "quantize": None, "step_cache": None,
                                  "vae_compile": False}
    assert "no speedup is assumed without history" in plan.why


def test_when_nothing_fits_nothing_is_chosen_and_the_refusal_is_the_submit_verdict_of_the_first(h3_tiny: Path):
    plan = _plan(h3_tiny, [], available=2**20)
    first = plan.candidates[0]
    checks = machine_check("cpu", False, None, "test CPU", 2**20)(_forecaster(h3_tiny)(PARAMS, False))
    over = next(c for c in checks if c.over)
    # The one wording of a refusal (`machine.walls.verdict`, what `jobs submit` says), for the first candidate.
    assert first.refusal == verdict(over, max(c.peak for c in checks if c.wall == over.wall))
    assert plan.choice is None and plan.why == (
        f"{first.refusal} (none of the 16 candidates of --plan fastest fits; the first in the order of preference:"
        " resident · bf16 · no lever)")
    assert plan.why.startswith("refused: needs ") and ", over the 1.0 MiB MemAvailable (" in plan.why
    with pytest.raises(ValueError, match="^refused: needs "):
        planned(PARAMS, plan)


def test_history_of_one_lever_set_never_times_another(h3_tiny: Path):
    from models.forecast.eta import estimate

    records = _history(h3_tiny, {"compile": 1e-6})
    work = stage_work(_forecaster(h3_tiny)(PARAMS, False))
    etas = {e.stage: e.seconds for e in estimate(work, records, KEY, lever_key({}))}
    assert etas["denoise.denoise"] is None and etas["text_encoder"] is not None


def test_a_lever_s_start_up_is_in_its_seconds_and_said_and_ranks_it(h3_tiny: Path):
    records = _history(h3_tiny, {"": 1e-6, "compile": 5e-7})
    steady = [r for r in records if r.stage != COMPILE_STAGE]
    cheap = _plan(h3_tiny, steady + [StageRecord(COMPILE_STAGE, 1.0, 1.0, KEY, "compile")])
    # Compile halves the steps' rate: with a 1 s first call it is the fastest, and that second is in its seconds.
    assert cheap.choice.levers["compile"] and cheap.choice.startup_seconds == 1.0
    plain = next(c for c in cheap.candidates if c.levers == cheap.candidates[0].levers and not c.sequential)
    assert plain.startup_seconds == 0.0 and plain.seconds > cheap.choice.seconds
    saved = plain.seconds - (cheap.choice.seconds - 1.0)
    dear = _plan(h3_tiny, steady + [StageRecord(COMPILE_STAGE, saved + 5.0, 1.0, KEY, "compile")])
    # A first call dearer than what compile saves over the steps: ranked by the whole, compile loses.
    assert not dear.choice.levers["compile"]
    compiled = next(c for c in dear.candidates if c.levers["compile"] and not c.sequential)
    assert compiled.seconds > dear.choice.seconds and compiled.startup_seconds == pytest.approx(saved + 5.0)
    lines = plan_lines(dear.to_dict())
    assert "seconds include each lever's start-up (the compiles' first calls, their own stages)" in lines[0]
    assert any("regional compile" in line and f" ({saved + 5.0:.1f} s start-up)" in line for line in lines)


def test_the_vae_decoder_compile_is_chosen_only_where_its_faster_decode_pays_for_its_first_call(h3_tiny: Path):
    # A VAE compile that halves the decode's rate; the DiT's stages of those runs time every candidate's steps (no DiT
    # lever differs), so only the decode and its first call tell the candidates apart.
    records = [r for r in _history(h3_tiny, {"": 1e-6, "vae_compile": 5e-7}) if r.stage != VAE_COMPILE_STAGE]
    cheap = _plan(h3_tiny, records + [StageRecord(VAE_COMPILE_STAGE, 1.0, 1.0, KEY, "vae_compile")])
    assert cheap.choice.levers["vae_compile"] and not cheap.choice.levers["compile"]
    assert cheap.choice.startup_seconds == 1.0
    plain = next(c for c in cheap.candidates if c.levers == cheap.candidates[0].levers and not c.sequential)
    saved = plain.seconds - (cheap.choice.seconds - 1.0)
    assert saved > 0
    dear = _plan(h3_tiny, records + [StageRecord(VAE_COMPILE_STAGE, saved + 5.0, 1.0, KEY, "vae_compile")])
    assert not dear.choice.levers["vae_compile"]
    assert any("VAE decoder compile" in line and f" ({saved + 5.0:.1f} s start-up)" in line
               for line in plan_lines(dear.to_dict()))


def test_the_walls_count_the_learned_process_start_up_and_the_table_says_so(h3_tiny: Path):
    forecast = _forecaster(h3_tiny)(PARAMS, False)
    available = forecast.process_host_bytes + forecast.predicted_peak_bytes + 2**20
    assert all(c.fits for c in _plan(h3_tiny, [], available).candidates if not c.sequential)
    plan = _plan(h3_tiny, [], available, startup=2**21)  # the same walls, with a learned 2 MiB start-up
    assert not any(c.fits for c in plan.candidates if not c.sequential)
    assert "walls: each counts the process start-up, 2.0 MiB (median of 1 past job)" in plan_lines(plan.to_dict())[0]
    assert "walls: the process start-up is not counted: no history on this machine" in \
        plan_lines(_plan(h3_tiny, [], available).to_dict())[0]
