"""A placement mode, a dtype and a job kind are each one registration (docs/extending.md): a throwaway one,
registered here and nowhere else, reaches every command's help, the Run page's form and fit panel, the forecast,
the submit check, History, Compare and a retry's offer."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from jobs.kinds import FormField, JobKind, job_kind
from jobs.spec import JobSpec
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


HASHES = ("sha256", "blake2b")


@dataclass(frozen=True)
class ChecksumOptions:
    """The made-up kind's own fields."""

    algorithm: str = "sha256"
    chunk_mib: int = 4


class ChecksumKind(JobKind):
    """A made-up kind: hash the checkpoint's bytes, a chunk at a time."""

    summary = "hash the checkpoint's bytes"
    options = ChecksumOptions
    form_fields = (FormField("algorithm", "Hash", choices=HASHES), FormField("chunk_mib", "Chunk (MiB)"))

    @classmethod
    def check(cls, raw, spec, config, problems) -> ChecksumOptions:
        options = super().check(raw, spec, config, problems)
        if options.algorithm not in HASHES:
            problems.add("algorithm", f"unknown hash {options.algorithm!r}; known: {', '.join(HASHES)}")
        return options

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument("--algorithm", help=f"one of {', '.join(HASHES)}")
        parser.add_argument("--chunk-mib", metavar="N", help="bytes read at a time, in MiB")

    @classmethod
    def arguments(cls, args) -> dict:
        given = {"algorithm": args.algorithm, "chunk_mib": args.chunk_mib}
        return {k: v for k, v in given.items() if v is not None}

    @classmethod
    def forecast(cls, spec, device, db):
        from jobs.admission import KindForecast, StageNeed

        return KindForecast([StageNeed("checksum", spec.options.chunk_mib * 2**20, 0, 0)])

    @staticmethod
    def run(spec, ctx) -> dict:
        digest = hashlib.new(spec.options.algorithm)
        with open(spec.model, "rb") as f:
            while chunk := f.read(spec.options.chunk_mib * 2**20):
                digest.update(chunk)
        return {"digest": digest.hexdigest()}


@pytest.fixture
def checksum(monkeypatch):
    """The made-up kind registered for one test, the registry as it was afterwards."""
    import jobs.kinds

    jobs.kinds.load_kinds()
    monkeypatch.setattr(jobs.kinds, "_KINDS", dict(jobs.kinds._KINDS))
    return job_kind("checksum")(ChecksumKind)


def test_a_registered_kind_brings_its_flags_its_check_and_its_options_to_the_command_line(checksum, fresh_db,
                                                                                         tiny_checkpoint, capsys):
    from jobs.cli import build_parser, main

    assert "--algorithm ALGORITHM" in _help(build_parser, "submit", "checksum")
    assert "checksum" in _help(build_parser, "submit")
    code = main(["submit", "checksum", "--model", str(tiny_checkpoint), "--algorithm", "md4", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and out["errors"] == ["algorithm: unknown hash 'md4'; known: sha256, blake2b"]
    main(["submit", "checksum", "--model", str(tiny_checkpoint), "--algorithm", "blake2b", "--chunk-mib", "2",
          "--json"])
    stored = json.loads(fresh_db.execute("SELECT spec FROM jobs").fetchone()[0])
    assert (stored["algorithm"], stored["chunk_mib"]) == ("blake2b", 2)  # flat beside the common fields
    spec = JobSpec.from_dict(stored)
    assert spec.options == ChecksumOptions("blake2b", 2)
    assert spec.forecast["stages"] == [{"stage": "checksum", "host": 2 * 2**20, "device": 0, "file_backed": 0}]
    assert spec.job_kind.run(spec, None)["digest"] == hashlib.blake2b(tiny_checkpoint.read_bytes()).hexdigest()


def test_a_registered_kinds_forecast_is_what_the_submit_check_refuses_by(checksum, data_dir, tiny_checkpoint):
    from jobs.admission import JobRefused, admit
    from jobs.spec import build_spec
    from storage.config import load_config

    config = load_config()
    spec = build_spec({"kind": "checksum", "model": str(tiny_checkpoint), "chunk_mib": "64",
                       "memory_budget": "32MiB"}, config)
    with pytest.raises(JobRefused, match=r"^refused: needs 64\.0 MiB, over the 32\.0 MiB budget"):
        admit(spec, config, None, available=2**34, total=2**35)


def test_a_registered_kind_is_offered_by_the_run_page_with_its_own_fields(checksum, fresh_db, tiny_checkpoint):
    at = _run_page().run()
    assert "checksum" in at.segmented_control(key="run_kind").options
    at.segmented_control(key="run_kind").set_value("checksum").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="run_algorithm").options == list(HASHES)
    at.selectbox(key="run_algorithm").set_value("blake2b").run()
    at.number_input(key="run_chunk_mib").set_value(8).run()
    at.button(key="run_submit").click().run()
    assert not at.exception, at.exception
    job_id, spec = fresh_db.execute("SELECT id, spec FROM jobs").fetchone()
    stored = json.loads(spec)
    assert (stored["kind"], stored["algorithm"], stored["chunk_mib"]) == ("checksum", "blake2b", 8)
    again = _run_page()
    again.query_params["from"] = str(job_id)  # edit and re-queue fills the kind's own fields too
    again.run()
    assert not again.exception, again.exception
    assert again.segmented_control(key="run_kind").value == "checksum"
    assert (again.selectbox(key="run_algorithm").value, again.number_input(key="run_chunk_mib").value) == ("blake2b", 8)


OLD_LOAD = {"kind": "load", "model": "/models/tiny.safetensors", "component": None, "mode": "drain", "device": "cpu",
            "dtype": "float16", "offload": {}, "sample_every": 1, "memory_limit": None, "gpus": 1,
            "memory_budget": None, "memory_floor": None, "drop_page_cache": None, "sequential_components": None,
            "generate": None, "skeleton": True, "offload_set": [], "forced": False, "forecast": None, "plan": None,
            "plan_lossy": False, "planned": None, "model_roots": []}
"""A load job's spec as stored before kinds had options of their own: every kind's fields, the others unset."""


def test_a_spec_stored_with_every_kinds_fields_still_reads_back_and_retries(fresh_db, tiny_checkpoint):
    from jobs.kinds.generate import GenerateJobOptions
    from jobs.kinds.load import LoadJobOptions
    from jobs.queue import retry
    from storage import jobs_table
    from storage.config import load_config

    load = JobSpec.from_dict({**OLD_LOAD, "model": str(tiny_checkpoint)})
    assert (load.mode, load.dtype, load.options) == ("drain", "float16", LoadJobOptions(skeleton=True))
    old_generate = {**OLD_LOAD, "kind": "generate", "skeleton": False, "sequential_components": False,
                    "generate": {"prompt": "a fox", "steps": 4}, "plan": "fastest", "planned": {"chosen": None}}
    generate = JobSpec.from_dict(old_generate)
    assert generate.options.generate.prompt == "a fox"
    assert generate.options == GenerateJobOptions(generate=generate.options.generate, sequential_components=False,
                                               plan="fastest", planned={"chosen": None})
    job_id = jobs_table.enqueue(fresh_db, "load", {**OLD_LOAD, "model": str(tiny_checkpoint), "skeleton": False})
    jobs_table.finish(fresh_db, job_id, "succeeded")
    again = retry(fresh_db, job_id, load_config())
    stored = json.loads(fresh_db.execute("SELECT spec FROM jobs WHERE id = ?", [again]).fetchone()[0])
    assert stored["mode"] == "drain" and "generate" not in stored and stored["skeleton"] is False


PLUGIN_MODULE = '''
from dataclasses import dataclass

from core.dtype_names import register_dtype
from jobs.kinds import JobKind, job_kind
from loader.placement import Placement, register_placement

register_dtype("float64", "fp64")


@register_placement("trickle")
class Trickle(Placement):
    summary = "copies each tensor through one bounce buffer"
    typical_footprint = 1.5


@dataclass(frozen=True)
class Options:
    algorithm: str = "sha256"


@job_kind("checksum")
class Checksum(JobKind):
    summary = "hash the checkpoint's bytes"
    options = Options

    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument("--algorithm")
'''
"""One plugin module adding a mode, a dtype and a kind, as a project would ship it."""


def test_a_plugin_module_the_setting_names_reaches_a_fresh_process(tmp_path):
    (tmp_path / "my_extension.py").write_text(PLUGIN_MODULE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAINBOARD_")}
    env.update({"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "DRAINBOARD_PLUGINS": "my_extension",
                "DRAINBOARD_DATA": str(tmp_path / "data")})
    done = subprocess.run([sys.executable, "-m", "jobs", "submit", "checksum", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "--algorithm ALGORITHM" in text
    assert "trickle: copies each tensor through one bounce buffer; about 1.5×" in text
    assert "bfloat16, float16, float32 or float64 (bf16, fp16, fp32, fp64 too)" in text
