"""A job child runs under the configuration its worker resolved, handed down: it reads no `drainboard.toml`
of its own working directory (which may be another one, or half-written)."""

from __future__ import annotations

import dataclasses
import os

import pytest

import jobs.supervisor
from jobs.supervisor import Supervisor
from storage.config import load_config
from storage.queries import get_job
from storage.schema import FINAL_STATUSES


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_half_written_config_in_the_childs_working_directory_does_not_fail_a_worker_resolved_elsewhere(
        config, db, queue_job, tmp_path, monkeypatch, start_method):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "drainboard.toml").write_text(f'memory_floor = "off"\nmodel_roots = ["{config.model_roots[0]}"]\n')
    resolved = load_config({**os.environ, "DRAINBOARD_CONFIG": str(elsewhere / "drainboard.toml")}, cwd=tmp_path)
    assert resolved.memory_floor == "off" and resolved.model_roots == config.model_roots
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "drainboard.toml").write_text("data_dir = [\n")  # half-written, where the child runs
    monkeypatch.setattr(jobs.supervisor, "REPO_ROOT", cwd)
    sup = Supervisor(resolved, start_method=start_method, grace=1.0)
    sup.start()
    try:
        job_id = queue_job("config")
        while get_job(db, job_id)["status"] not in FINAL_STATUSES:
            sup.tick()
    finally:
        sup.stop()
    job = get_job(db, job_id)
    assert job["status"] == "succeeded", job["error"]
    assert job["metrics"]["cwd"] == str(cwd)
    assert job["metrics"]["config"] == resolved.to_json() != dataclasses.replace(resolved, memory_floor=None).to_json()
