"""Bad settings are refused when a part starts, in one line with exit 2, before any job is claimed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jobs.presence import REPO_ROOT
from jobs.queue import enqueue
from jobs.spec import JobSpec
from jobs.supervisor import Supervisor
from storage.config import Config, ConfigError
from storage.schema import open_database
from storage.queries import get_job


def _jobs(tmp_path, env_changes: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAINBOARD_")}
    env.update({"DRAINBOARD_DATA": str(tmp_path / "data"), "PYTHONPATH": str(REPO_ROOT), **env_changes})
    return subprocess.run([sys.executable, "-m", "jobs", *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


BAD_SETTINGS = [
    ({"DRAINBOARD_MEMORY_FLOOR": "lots"}, None, "memory_floor (DRAINBOARD_MEMORY_FLOOR or drainboard.toml): 'lots'"),
    ({}, 'memory_floor = "-5GB"\n', "'-5GB' is negative"),
    ({}, "data_dir = 5\n", "data_dir must be a string, got 5"),
    ({}, b'data_dir = "caf\xe9"\n', "not UTF-8 text (byte 0xe9 at offset 15)"),
    ({"DRAINBOARD_PLUGINS": "no_such_kinds"}, None,
     "DRAINBOARD_PLUGINS names 'no_such_kinds', which cannot be imported"),
]


@pytest.mark.parametrize("env, toml, message", BAD_SETTINGS)
@pytest.mark.parametrize("argv", [("list",), ("list", "--json"), ("worker", "--once")])
def test_a_bad_setting_is_one_line_and_exit_2_in_every_command(tmp_path, env, toml, message, argv):
    if toml is not None:
        (tmp_path / "drainboard.toml").write_bytes(toml if isinstance(toml, bytes) else toml.encode())
    result = _jobs(tmp_path, env, *argv)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    if "--json" in argv:
        out = json.loads(result.stdout)
        assert out["ok"] is False and message in out["error"]
    else:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_drainboard_data_naming_a_file_is_refused(tmp_path):
    (tmp_path / "data").write_text("not a folder")
    result = _jobs(tmp_path, {}, "list", "--json")
    assert result.returncode == 2, result.stderr
    assert json.loads(result.stdout)["error"] == f"DRAINBOARD_DATA names {tmp_path / 'data'}, which is not a folder; " \
                                                 f"the data folder holds the job database and artifacts"


def test_a_worker_with_a_bad_floor_claims_nothing(tmp_path):
    """The worker checks its settings before its first claim: the queued job stays queued for a fixed worker."""
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    (data / "models" / "dummy.safetensors").write_bytes(b"")
    config = Config(data_dir=data, model_roots=[data / "models"], memory_floor="lots")
    db = open_database(config.db_path)
    job_id = enqueue(db, JobSpec(kind="load", model=str(data / "models" / "dummy.safetensors")))
    with pytest.raises(ConfigError, match="memory_floor"):
        Supervisor(config, start_method="spawn").run(once=True)
    assert get_job(db, job_id)["status"] == "queued"


def test_drainboard_data_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    result = _jobs(tmp_path, {"DRAINBOARD_DATA": str(tmp_path / "file" / "data")}, "list", "--json")
    assert result.returncode == 2, result.stderr
    assert json.loads(result.stdout)["error"].startswith(f"DRAINBOARD_DATA names {tmp_path / 'file' / 'data'}, under "
                                                         f"{tmp_path / 'file'}, which is not a folder")
