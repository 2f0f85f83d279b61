"""The stdout line protocol (`jobs.wire`) and its receiving end (`jobs.backends.follow`), without Ray:
what a remote child writes, cut into arbitrary chunks, lands in the same tables as a local child's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.backends.follow import Follower
from jobs.wire import LineWriter, StdoutReporter, decode, encode
from machine.memory import MemorySample
from storage.artifacts import job_dir
from storage.queries import artifacts, events, get_job, last_sample, sample_count

REPO = str(Path(__file__).resolve().parents[2])


def _sample(t: float, rss: int) -> MemorySample:
    return MemorySample(t, rss, rss // 2, rss // 4, rss, 8 * 2**30, 0, 0, None)


def test_a_tagged_line_is_found_after_output_left_without_a_newline_and_a_cut_line_is_ignored():
    line = encode("progress", [3, 10]).decode()
    assert decode(line) == ("progress", [3, 10])
    assert decode("50%|#####     " + line) == ("progress", [3, 10])
    assert decode(line[: len(line) // 2]) is None
    assert decode("Running entrypoint for job drainboard-1") is None


def _stream(tmp_path, job_id: int, video: bytes) -> bytes:
    """Everything a child reports for one job, as the bytes it writes to stdout."""
    out = tmp_path / "stdout"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    writer = LineWriter(fd)
    os.close(fd)
    reporter = StdoutReporter(job_id, writer, environ={"DRAINBOARD_JOB_SPEC": json.dumps({"kind": "steps"})})
    assert reporter.spec() == {"kind": "steps"}
    sink = reporter.sample_sink(100.0, time.monotonic)
    reporter.stage("load")
    for step in range(1, 4):
        sink.add(_sample(100.0 + step, step * 2**20), stage="load", tensors_placed=step, bytes_placed=step * 1024,
                 tensor_name=f"blocks.{step}.weight")
        reporter.progress(step, 3)
    reporter.event({"t": 1.5, "created_at": 1.0, "kind": "warning", "stage": "load", "message": "hot", "data": None})
    path = tmp_path / "video.mp4"
    path.write_bytes(video)
    reporter.artifact(path)
    reporter.metrics({"steps": 3})
    reporter.exit(0)
    writer.close()
    return b"some library output\n" + out.read_bytes()


def test_a_remote_childs_stream_in_odd_chunks_lands_in_the_tables_and_its_artifact_in_the_jobs_folder(
        db, config, queue_job, tmp_path):
    job_id = queue_job("steps")
    video = os.urandom(500_000)  # three chunks
    stream = _stream(tmp_path, job_id, video).decode()
    log = job_dir(config.data_dir, job_id) / "child.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    follower = Follower(config.db_path, config.data_dir, job_id, log)
    for start in range(0, len(stream), 7919):  # chunk edges fall mid-line
        follower.feed(stream[start:start + 7919])
    follower.close()

    assert follower.exit_code == 0 and follower.started["pid"] == os.getpid()
    assert sample_count(db, job_id) == 3
    assert last_sample(db, job_id)["tensor_name"] == "blocks.3.weight" and last_sample(db, job_id)["t"] == 3.0
    job = get_job(db, job_id)
    assert (job["stage"], job["progress_done"], job["progress_total"], job["metrics"]) == ("load", 3, 3, {"steps": 3})
    assert [e["kind"] for e in events(db, job_id)] == ["host", "warning"]
    assert (job_dir(config.data_dir, job_id) / "video.mp4").read_bytes() == video
    assert [a["name"] for a in artifacts(db, job_id)] == ["video.mp4"]
    assert log.read_text() == "some library output\n"


def test_a_damaged_or_misnamed_artifact_is_not_registered_and_the_stream_goes_on(db, config, queue_job, tmp_path):
    job_id = queue_job("steps")
    lines = _stream(tmp_path, job_id, b"x" * 1000).decode().splitlines(keepends=True)
    damaged = [line.replace('"sha256":"', '"sha256":"0') if "artifact_end" in line else line for line in lines]
    log = tmp_path / "child.log"
    follower = Follower(config.db_path, config.data_dir, job_id, log)
    follower.feed("".join(damaged))
    follower.feed(encode("artifact", {"name": "../../drainboard.db.mp4", "size": 1}).decode())
    follower.close()
    assert artifacts(db, job_id) == [] and not (job_dir(config.data_dir, job_id) / "video.mp4").exists()
    assert list(job_dir(config.data_dir, job_id).iterdir()) == []
    assert "arrived damaged" in log.read_text() and "not a plain artifact name" in log.read_text()
    assert follower.exit_code == 0 and get_job(db, job_id)["metrics"] == {"steps": 3}


def test_a_supervisor_without_a_ray_address_never_imports_ray(config, tmp_path):
    """In a fresh interpreter (other tests may have imported ray): a job queued, run and ended locally."""
    script = (
        "import sys, time\n"
        "from jobs.queue import submit\n"
        "from jobs.supervisor import Supervisor\n"
        "from storage.config import load_config\n"
        "from storage.schema import open_database\n"
        "config = load_config()\n"
        "assert config.ray_address is None\n"
        "db = open_database(config.db_path)\n"
        "job = submit(db, {'kind': 'steps', 'model': str(config.model_roots[0] / 'dummy.safetensors')}, config)\n"
        "sup = Supervisor(config, start_method='spawn')\n"
        "sup.start()\n"
        "while job not in sup.finished:\n"
        "    sup.tick(); time.sleep(0.05)\n"
        "sup.stop()\n"
        "print(sup.backend, 'ray' in sys.modules, db.execute('SELECT status FROM jobs').fetchone()[0])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DRAINBOARD_RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", script], env={**env, "PYTHONPATH": REPO}, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.split() == ["None", "False", "succeeded"], done.stderr[-2000:]


@pytest.mark.parametrize("value", ["head:8265", "ray://head:10001"])
def test_a_ray_address_that_is_no_dashboard_url_is_refused_naming_the_variable(value, tmp_path):
    from storage.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"DRAINBOARD_RAY_ADDRESS: ray_address must be the Ray dashboard's http"):
        load_config({"DRAINBOARD_RAY_ADDRESS": value}, cwd=tmp_path)


def test_a_ray_address_without_ray_installed_is_one_clear_line(config, monkeypatch):
    import dataclasses
    import importlib.util

    from jobs.backends import backend_for
    from storage.config import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError, match=r"ray_address is set \(http://head:8265\) but ray is not installed here: "
                                          r"pip install -r requirements-ray.txt"):
        backend_for(dataclasses.replace(config, ray_address="http://head:8265"), None, "host:1:abcd")
