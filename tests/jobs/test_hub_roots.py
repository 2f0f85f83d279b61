"""The Hugging Face cache is a model root with nothing configured, and a worker refuses, in words, a job
checked at submit against other model roots than its own."""

from __future__ import annotations

import os

import pytest
import torch

from jobs.queue import submit
from storage.config import load_config
from tests.hub_layout import hub_snapshot
from tests.jobs.test_kind_load import write_component


@pytest.fixture
def config(config, tmp_path, monkeypatch):
    """The jobs' config with a Hugging Face cache at tmp_path/hf/hub (HF_HOME only: nothing else set)."""
    (tmp_path / "hf" / "hub").mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return load_config()


@pytest.fixture
def snapshot(config, tmp_path):
    write_component(tmp_path / "download", {"w": torch.arange(6, dtype=torch.float32)})
    return hub_snapshot(tmp_path / "download", config.hub_cache)


def test_a_load_job_reads_a_hub_snapshot_with_nothing_configured(db, config, snapshot, run_to_end):
    job = run_to_end(submit(db, {"kind": "load", "model": str(snapshot), "component": "transformer"}, config))
    assert job["status"] == "succeeded", job["error"]
    assert job["metrics"]["tensors_placed"] == 1
    assert job["spec"]["model_roots"] == [str(r) for r in config.model_roots]
    assert str(config.hub_cache) in job["spec"]["model_roots"]


def test_a_job_submitted_against_other_roots_is_refused_by_the_worker_naming_both(
        db, config, snapshot, run_to_end, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAINBOARD_MODEL_ROOTS", os.pathsep.join([str(config.model_roots[0]), str(tmp_path / "more")]))
    (tmp_path / "more").mkdir()
    other = load_config()  # what a submitter with another drainboard.toml saw
    job = run_to_end(submit(db, {"kind": "load", "model": str(snapshot), "component": "transformer"}, other))
    assert job["status"] == "failed"
    assert job["error"].startswith("this job was checked against the model roots ")
    assert str(tmp_path / "more") in job["error"] and "start the worker with the same model roots" in job["error"]
    assert "Traceback" not in job["error"]


def test_a_spec_stored_before_roots_were_recorded_still_runs(db, config, snapshot, run_to_end):
    from jobs.spec import JobSpec

    spec = JobSpec.from_dict({"kind": "load", "model": str(snapshot)})
    assert spec.model_roots == () and spec.roots_mismatch(["/anything"]) is None
