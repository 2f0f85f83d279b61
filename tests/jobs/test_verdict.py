"""One verdict the guard agrees with: every host wall counts the job's process start-up, learned from this
machine's past jobs ("no history" until there is one), plus its stage, as the memory guard counts growth over
the job's start; a refusal names the whole job's need once, in the words of whoever asked."""

from __future__ import annotations

import json

import pytest

from jobs.admission import JobRefused, admit, assess, remedy
from jobs.cli import main
from jobs.history import process_records
from jobs.kinds.generate import GenerateJobOptions
from jobs.spec import JobSpec
from machine.device import DeviceInfo
from models import GenerateParams
from models.forecast.eta import NO_HISTORY
from models.forecast.process_size import ProcessRecord, estimate_process
from storage import jobs_table
from storage.queries import get_job, list_jobs
from storage.sample_writer import append_samples, sample_row

pytestmark = pytest.mark.usefixtures("launched_workers")  # submits here start no real worker

GIB, MIB = 2**30, 2**20
CPU = DeviceInfo("cpu", "cpu", None, "test CPU", True, 64 * GIB, "cpu", "a CPU")
HERE = "cpu:test CPU"
START_UP = 334 * MIB
"""What the demo profile's generate grew system in use by before its first weight on the 2-core box."""


def _generate(model, **fields) -> JobSpec:
    return JobSpec("generate", str(model), options=GenerateJobOptions(generate=GenerateParams(
        prompt="a whale at dusk", frames=124, height=64, width=64, steps=3)), **fields)


def past_job(db, config, model, *, kind: str = "generate", device: str = HERE, start_up: int = START_UP,
             ready: int = 509 * MIB, status: str = "succeeded") -> int:
    """A finished job of `kind` as a worker leaves it: its spec's forecast names `device`; its first sample and
    its first weight's sample are `start_up` of system in use apart (and its anonymous memory agrees)."""
    spec = _generate(model) if kind == "generate" else JobSpec("load", str(model), component="transformer")
    spec = JobSpec.from_dict({**spec.to_dict(), "forecast": {"device": device}})
    job_id = jobs_table.enqueue(db, kind, spec.to_dict(), now=0.0)
    if status != "queued":
        jobs_table.start(db, job_id, supervisor_id="test", now=0.0)
        jobs_table.finish(db, job_id, status, now=1.0)
    first_stage = "load.text_encoder" if kind == "generate" else "load"
    append_samples(db, job_id, 0, [
        sample_row(job_id=job_id, seq=0, rank=0, t=0.1, stage="probe", vm_rss=216 * MIB, rss_anon=185 * MIB,
                   mem_available=20 * GIB),
        sample_row(job_id=job_id, seq=1, rank=0, t=2.0, stage="prepare", vm_rss=480 * MIB, rss_anon=300 * MIB,
                   mem_available=20 * GIB - start_up // 2),
        sample_row(job_id=job_id, seq=2, rank=0, t=3.0, stage=first_stage, vm_rss=ready,
                   rss_anon=start_up + 100 * MIB, mem_available=20 * GIB - start_up),
    ])
    return job_id


def _admit(spec, config, db, **kwargs):
    return admit(spec, config, db, probe=lambda _: CPU, available=32 * GIB, total=64 * GIB, **kwargs)


def test_the_process_is_learned_from_this_machines_past_jobs_of_the_same_kind_and_device():
    records = [ProcessRecord("generate", HERE, 500 * MIB, 300 * MIB), ProcessRecord("generate", HERE, 520 * MIB,
                                                                                     340 * MIB),
               ProcessRecord("generate", HERE, 510 * MIB, 320 * MIB), ProcessRecord("load", HERE, 1, 1),
               ProcessRecord("generate", "cuda:NVIDIA H200", 9 * GIB, 9 * GIB)]
    found = estimate_process(records, "generate", HERE)
    assert (found.ready_bytes, found.startup_bytes, found.basis) == (510 * MIB, 320 * MIB, "median of 3 past jobs")
    nothing = estimate_process(records, "generate", "cpu:elsewhere")
    assert (nothing.ready_bytes, nothing.startup_bytes, nothing.basis) == (None, None, NO_HISTORY)


def test_history_reads_the_start_up_from_a_jobs_first_sample_and_its_first_weights(db, config, tiny_model):
    past_job(db, config, tiny_model, start_up=300 * MIB, ready=500 * MIB)
    past_job(db, config, tiny_model, start_up=200 * MIB, status="killed")  # the guard stopped it after its start-up
    past_job(db, config, tiny_model, kind="load", start_up=20 * MIB, ready=230 * MIB)
    queued = past_job(db, config, tiny_model, status="queued")
    assert get_job(db, queued)["status"] == "queued"
    assert sorted(r.startup_bytes for r in process_records(db, "generate")) == [200 * MIB, 300 * MIB]
    assert [(r.kind, r.ready_bytes, r.startup_bytes) for r in process_records(db, "load")] == [
        ("load", 230 * MIB, 20 * MIB)]


def test_other_processes_moving_memavailable_are_not_the_jobs_start_up():
    """The machine's MemAvailable moves with every process on it: a job grew system in use by at least the
    anonymous memory it added and at most all it holds (its pages shared with the fork server copied)."""
    from jobs.history import start_up

    first = {"mem_available": 20 * GIB, "rss_anon": 185 * MIB}
    assert start_up(first, {"mem_available": 20 * GIB - 334 * MIB, "rss_anon": 377 * MIB}) == 334 * MIB
    assert start_up(first, {"mem_available": 19 * GIB, "rss_anon": 377 * MIB}) == 377 * MIB  # others grew
    assert start_up(first, {"mem_available": 21 * GIB, "rss_anon": 377 * MIB}) == 192 * MIB  # others shrank


def test_without_history_the_process_is_unknown_and_no_wall_counts_it(db, config, tiny_model):
    found = assess(_generate(tiny_model), config, db, probe=lambda _: CPU, available=32 * GIB, total=64 * GIB)
    assert found.startup is None and found.process["basis"] == NO_HISTORY and found.job_peak is None
    assert found.tightest.peak == max(s.host for s in found.stages)


def test_a_budget_the_stages_fit_but_not_with_the_process_is_refused_naming_the_whole_jobs_need(db, config,
                                                                                                tiny_model):
    """The issue's 230 MiB case: the stages alone fit under the budget; with the process's start-up, as the guard
    counts it, they do not. Today the job is admitted and the guard kills it while it loads."""
    past_job(db, config, tiny_model)
    stages = assess(_generate(tiny_model), config, None, probe=lambda _: CPU, available=32 * GIB, total=64 * GIB)
    peak = max(s.host for s in stages.stages)
    budget = peak + START_UP // 2
    with pytest.raises(JobRefused) as refused:
        _admit(_generate(tiny_model, memory_budget=budget), config, db)
    need = START_UP + peak
    assert str(refused.value) == (f"refused: needs {need / MIB:.1f} MiB, over the {budget / MIB:.1f} MiB budget: "
                                  f"pass --memory-budget {-(-need // MIB)}MiB or more, or --force")
    assert refused.value.admission.need == need
    fits = _admit(_generate(tiny_model, memory_budget=need), config, db)
    assert fits.forecast["refusal"] is None and fits.forecast["startup"] == START_UP
    assert fits.forecast["job_peak"] == 509 * MIB + peak


def test_at_50_mib_forced_the_recorded_refusal_says_the_start_up_alone_is_over_it(db, config, tiny_model):
    """The issue's 50 MiB case: the guard stopped the forced job while it started; the forecast says so."""
    past_job(db, config, tiny_model)
    spec = _admit(_generate(tiny_model, memory_budget=50 * MIB, forced=True), config, db)
    assert spec.forecast["need"] > START_UP > 50 * MIB
    assert spec.forecast["refusal"].startswith(f"refused: needs {spec.forecast['need'] / MIB:.1f} MiB, over the 50.0")


def test_the_cli_says_the_need_once_with_its_own_remedy_and_the_page_with_its_own(db, config, tiny_model, capsys):
    from machine.device import probe_device
    from models.forecast.eta import device_key

    this_cpu = probe_device("cpu")
    past_job(db, config, tiny_model, device=device_key(this_cpu.kind, this_cpu.name))
    code = main(["submit", "generate", "--model", str(tiny_model), "--prompt", "a whale", "--frames", "124",
                 "--height", "64", "--width", "64", "--steps", "3", "--memory-budget", "300MiB", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and list_jobs(db) != [] and len(list_jobs(db)) == 1  # only the seeded past job
    assert out["error"].count("needs ") == 1 and out["error"].count("--force") == 1
    assert "would peak" not in out["error"]
    assert remedy("budget", 690 * MIB, cli=False) == "set the budget to at least that, or tick *Queue anyway*"
    assert "--" not in remedy("budget", 690 * MIB, cli=False)


def test_a_loads_limit_counts_its_start_up_and_a_retry_is_told_the_same_number(db, config, tiny_model):
    past_job(db, config, tiny_model, kind="load", start_up=40 * MIB, ready=230 * MIB)
    spec = JobSpec("load", str(tiny_model), component="transformer", memory_limit=MIB)
    found = assess(spec, config, db, probe=lambda _: CPU, available=32 * GIB, total=64 * GIB)
    stage = found.stages[0]
    assert found.needs["limit"] == 40 * MIB + stage.host - stage.file_backed
    assert found.refusal.startswith(f"refused: needs {found.needs['limit'] / MIB:.1f} MiB, over the 1.0 MiB memory")
