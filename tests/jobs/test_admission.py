"""Refusal at submit: a job whose forecast cannot fit is refused with one line (its need, the wall), exit 2,
nothing queued; --force queues it and the job records it; the walls agree with the forecast's host/device."""

from __future__ import annotations

import json
import re

import pytest

from jobs.admission import JobRefused, StageNeed, _first_refusal, admit
from jobs.cli import main
from jobs.kinds.generate import GenerateJobOptions
from jobs.spec import JobSpec
from machine.device import DeviceInfo
from storage.queries import list_jobs

pytestmark = pytest.mark.usefixtures("launched_workers")  # submits here start no real worker

GIB = 2**30
CPU = DeviceInfo("cpu", "cpu", None, "test CPU", True, 64 * GIB, "cpu", "a CPU")
H200 = DeviceInfo("cuda", "cuda", 0, "NVIDIA H200", False, int(139.8 * GIB), "cuda-driver", "made up for a test")


def _submit(model, *extra):
    return ["submit", "generate", "--model", str(model), "--prompt", "a red fox", "--frames", "124",
            "--height", "64", "--width", "64", "--steps", "3", *extra]


def test_an_over_budget_generate_is_refused_in_one_line_exit_2_and_nothing_is_queued(db, config, tiny_model,
                                                                                     capsys):
    code = main(_submit(tiny_model, "--memory-budget", "10MiB", "--json"))
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and out["ok"] is False and len(out["errors"]) == 1
    assert out["error"].startswith("refused: needs ")
    assert "over the 10.0 MiB budget" in out["error"]
    assert list_jobs(db) == []


def test_force_queues_it_and_the_job_records_that_it_was_forced(db, config, tiny_model, capsys):
    code = main(_submit(tiny_model, "--memory-budget", "10MiB", "--force", "--json"))
    job = json.loads(capsys.readouterr().out)
    assert code == 0 and job["status"] == "queued"
    spec = list_jobs(db)[0]["spec"]
    assert spec["forced"] is True and spec["forecast"]["refusal"].startswith("refused: needs ")
    assert [s["stage"] for s in spec["forecast"]["stages"]] == ["text_encoder", "denoise.denoise", "decode.video",
                                                                "decode.audio"]
    main(["show", str(job["id"])])
    assert "forced: queued over the forecast (refused: needs " in capsys.readouterr().out


def test_a_generate_that_fits_is_queued_with_its_forecast_and_no_history_eta(db, config, tiny_model):
    spec = JobSpec("generate", str(tiny_model), options=GenerateJobOptions(generate=__import__("models").GenerateParams(
        prompt="a red fox", frames=124, height=64, width=64, steps=3)))
    admitted = admit(spec, config, db, probe=lambda _: CPU, available=32 * GIB, total=64 * GIB)
    assert admitted.forecast["refusal"] is None and not admitted.forced
    assert {e["basis"] for e in admitted.forecast["eta"]} == {"no history on this machine"}
    with pytest.raises(JobRefused, match=r"^refused: needs .* over the 512\.0 MiB MemAvailable less the .* floor"):
        admit(spec, config, db, probe=lambda _: CPU, available=GIB // 2, total=64 * GIB)


def _spec(**fields):
    return JobSpec("generate", "/m", **fields)


def test_a_memory_limit_counts_anonymous_memory_only_and_says_so(config):
    need = [StageNeed("load.transformer", host=3 * GIB, device=0, file_backed=2 * GIB)]
    args = (config, CPU, need, 0, 0, 100 * GIB, 128 * GIB)
    assert _first_refusal(_spec(memory_limit=2 * GIB), *args) is None  # 1 GiB anonymous under a 2 GiB limit
    line = _first_refusal(_spec(memory_limit=GIB // 2), *args)
    assert line == ("refused: needs 1.00 GiB, over the 512.0 MiB memory limit "
                    "(anonymous memory; file-backed pages are reclaimable)")


def test_a_discrete_gpu_refuses_on_its_pool_and_unified_memory_on_the_sum(config):
    need = [StageNeed("denoise.denoise", host=10 * GIB, device=139 * GIB, file_backed=0)]
    line = _first_refusal(_spec(), config, H200, need, GIB, GIB, 500 * GIB, 512 * GIB)
    assert line == "refused: needs 139.00 GiB, over NVIDIA H200's 139.80 GiB less the 1.00 GiB CUDA context"
    gb10 = DeviceInfo("cuda", "cuda", 0, "NVIDIA GB10", True, 121 * GIB, "cuda-driver", "made up")
    need = [StageNeed("decode.video", host=40 * GIB, device=60 * GIB, file_backed=0)]
    line = _first_refusal(_spec(memory_floor=20 * GIB), config, gb10, need, GIB, 0, 110 * GIB, 121 * GIB)
    assert line == ("refused: needs 101.00 GiB, over the 110.00 GiB MemAvailable less the "
                    "20.00 GiB floor")


def test_the_tightest_check_is_the_refused_one_or_else_the_stage_nearest_its_wall(config):
    from jobs.admission import tightest, wall_checks

    needs = [StageNeed("text_encoder", host=2 * GIB, device=0, file_backed=0),
             StageNeed("decode.video", host=6 * GIB, device=0, file_backed=0)]
    args = (config, CPU, needs, GIB, 0, 100 * GIB, 128 * GIB)
    fits = tightest(wall_checks(_spec(memory_budget=10 * GIB), *args))
    # the budget counts the process's start-up (1 GiB here) with the stage, as the guard counts growth
    assert (fits.stage, fits.wall, fits.peak, fits.allowance) == ("decode.video", "budget", 7 * GIB, 10 * GIB)
    assert fits.line == "decode.video would peak at 7.00 GiB, under the 10.00 GiB budget" and not fits.over
    refused = tightest(wall_checks(_spec(memory_budget=4 * GIB), *args))
    assert refused.over and _first_refusal(_spec(memory_budget=4 * GIB), *args) == \
        "refused: needs 7.00 GiB, over the 4.00 GiB budget"


def test_plan_fastest_at_submit_records_the_plan_runs_its_choice_and_refuses_when_nothing_fits(db, config,
                                                                                              tiny_model, capsys):
    code = main(_submit(tiny_model, "--plan", "fastest"))
    assert code == 0
    assert any(line.startswith(" * resident") for line in capsys.readouterr().err.splitlines())
    spec = list_jobs(db)[0]["spec"]
    plan = spec["planned"]
    chosen = plan["candidates"][plan["chosen"]]
    assert spec["plan"] == "fastest" and not plan["lossy"] and all(c["lossless"] for c in plan["candidates"])
    assert {k: spec["generate"][k] for k in ("attention", "compile", "vae_compile")} == \
        {k: chosen["levers"][k] for k in ("attention", "compile", "vae_compile")}
    assert spec["sequential_components"] is chosen["sequential"] and "no history" in plan["why"]
    code = main(_submit(tiny_model, "--plan", "fastest", "--memory-budget", "10MiB", "--json"))
    out = json.loads(capsys.readouterr().out)
    main(_submit(tiny_model, "--memory-budget", "10MiB", "--json"))
    plain = json.loads(capsys.readouterr().out)["error"]
    # The plain refusal's one-line verdict and remedy, the plan said between them (for its first candidate).
    verdict = r"refused: needs [\d.]+ MiB, over the 10\.0 MiB budget"
    remedy = r"pass --memory-budget \d+MiB or more, or --force"
    assert re.fullmatch(f"{verdict}: {remedy}", plain)
    assert code == 2 and re.fullmatch(f"{verdict} \\(none of the 16 candidates of --plan fastest fits; the first in the"
                                      f" order of preference: resident · bf16 · no lever\\): {remedy}", out["error"])
    assert len(list_jobs(db)) == 1
