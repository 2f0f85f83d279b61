import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jobs.cli import main
from jobs.presence import REPO_ROOT, supervisor_status
from storage.queries import list_jobs

pytestmark = pytest.mark.usefixtures("launched_workers")  # submits here start no real worker


def test_a_bad_submit_prints_the_json_failure_shape_and_exits_2(db, config, capsys):
    code = main(["submit", "load", "--model", "/etc/passwd", "--mode", "stram", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and out["ok"] is False
    assert out["errors"][0].startswith("model:") and out["errors"][1].startswith("mode:")
    assert list_jobs(db) == []


def test_submit_wait_json_starts_a_worker_and_prints_the_finished_job(db, config):
    model = str(config.model_roots[0] / "dummy.safetensors")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "jobs", "submit", "load", "--model", model, "--wait", "--json"],
            cwd=REPO_ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=120,
        )
        job = json.loads(result.stdout)
        assert job["status"] == "succeeded", result.stderr
        assert job["id"] == 1 and job["metrics"]["tensors_placed"] == 1
        assert [a["name"] for a in job["artifacts"]] == ["child.log"]
        assert os.path.isfile(job["artifacts"][0]["path"])
        assert supervisor_status(db)["alive"]
    finally:
        _stop_worker(db)
    assert not supervisor_status(db)["alive"]


def test_show_and_list_print_a_job(db, config, capsys):
    model = str(config.model_roots[0] / "dummy.safetensors")
    assert main(["submit", "load", "--model", model, "--json"]) == 0
    printed = capsys.readouterr()
    queued = json.loads(printed.out)
    assert queued["status"] == "queued" and queued["spec"]["model"] == model
    assert f"job {queued['id']} queued; the running worker (pid {os.getpid()}) takes it in turn" in printed.err
    assert main(["show", str(queued["id"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == queued["id"]
    assert main(["list"]) == 0
    assert "queued" in capsys.readouterr().out
    assert main(["cancel", str(queued["id"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "cancelled"
    assert main(["show", "999", "--json"]) == 2


def test_submit_generate_with_a_bad_image_exits_2_and_queues_nothing(db, config, capsys, tmp_path, tiny_model):
    from storage.queries import list_jobs

    model = tiny_model
    not_image = tmp_path / "frame.png"
    not_image.write_text("hello")
    code = main(["submit", "generate", "--model", str(model), "--prompt", "a fox", "--image", str(not_image),
                 "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 2 and body["ok"] is False
    assert any(e.startswith(f"generate.image: {not_image}: not a readable image") for e in body["errors"]), body
    assert list_jobs(db) == []


def test_submit_generate_with_a_truncated_clip_exits_2_in_one_line_and_queues_nothing(
        db, config, capsys, tmp_path, tiny_model):
    import numpy as np

    from models.video.encode import write_mp4
    from storage.queries import list_jobs

    clip = tmp_path / "motion.mp4"
    write_mp4(clip, (np.random.RandomState(3).rand(20, 48, 80, 3) * 255).astype(np.uint8), 24)
    clip.write_bytes(clip.read_bytes()[: clip.stat().st_size // 2])
    code = main(["submit", "generate", "--model", str(tiny_model), "--prompt", "a fox", "--ref-video", str(clip),
                 "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 2 and body["ok"] is False
    assert [e for e in body["errors"] if e.startswith(f"generate.ref_video: {clip}: truncated")], body
    assert list_jobs(db) == [] and not (config.data_dir / "artifacts").exists()


def _stop_worker(db) -> None:
    status = supervisor_status(db)
    if status["alive"]:
        os.kill(status["pid"], signal.SIGTERM)
        deadline = time.time() + 10
        while supervisor_status(db)["alive"] and time.time() < deadline:
            time.sleep(0.1)


def test_submit_without_wait_starts_a_worker_that_runs_the_job(db, config):
    """A user who queues a job from the CLI expects it to run, as the dashboard and --wait have it."""
    model = str(config.model_roots[0] / "dummy.safetensors")
    try:
        result = subprocess.run([sys.executable, "-m", "jobs", "submit", "load", "--model", model, "--json"],
                                cwd=REPO_ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=120)
        job = json.loads(result.stdout)
        assert result.returncode == 0 and job["status"] in ("queued", "running"), result.stderr
        assert f"job {job['id']} queued; started a worker for it (pid " in result.stderr
        deadline = time.time() + 90
        while list_jobs(db)[0]["status"] != "succeeded":
            assert time.time() < deadline, open(config.data_dir / "worker.log").read()
            time.sleep(0.2)
    finally:
        _stop_worker(db)


def test_list_and_show_end_the_job_of_a_sigkilled_worker_themselves(db, config, monkeypatch, capsys):
    """No page and no new worker needed: the CLI sees the dead supervisor and says the job was interrupted."""
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "100000")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.01")
    model = str(config.model_roots[0] / "dummy.safetensors")
    from jobs.queue import submit

    job_id = submit(db, {"kind": "steps", "model": model}, config)
    worker = subprocess.Popen([sys.executable, "-m", "jobs", "worker"], cwd=REPO_ROOT, env=dict(os.environ))
    try:
        deadline = time.time() + 90
        while list_jobs(db)[0]["progress_done"] is None:
            assert time.time() < deadline, "the worker never started the job"
            time.sleep(0.1)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        assert main(["list"]) == 0
        assert "interrupted" in capsys.readouterr().out
        assert main(["show", str(job_id)]) == 0
        assert "stopped while the job was running" in capsys.readouterr().out
    finally:
        if worker.poll() is None:
            worker.kill()


def test_show_prints_a_short_summary_and_keeps_the_full_record_for_json(db, config, capsys):
    from storage import jobs_table

    model = str(config.model_roots[0] / "dummy.safetensors")
    assert main(["submit", "load", "--model", model, "--json"]) == 0
    job_id = json.loads(capsys.readouterr().out)["id"]
    metrics = {"bytes_placed": 42375936, "footprint_ratio": 1.029607747189348, "load_seconds": 0.3517679119999002,
               "loaded": [f"blocks.{i}.weight" for i in range(5000)], "stage_peaks": {"load": 2**30}}
    jobs_table.start(db, job_id, supervisor_id="test")
    jobs_table.finish(db, job_id, "succeeded", metrics=metrics)
    assert main(["show", str(job_id)]) == 0
    text = capsys.readouterr().out
    assert "bytes_placed: 40.4 MiB" in text and "footprint_ratio: 1.030" in text and "load_seconds: 0.35" in text
    assert "blocks.4999.weight" not in text and "stage_peaks" not in text and len(text) < 1000
    assert f"(the full record: python -m jobs show {job_id} --json)" in text
    assert main(["show", str(job_id), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"] == metrics


def test_a_queued_job_moves_to_the_front_and_clear_cancels_every_queued_job(db, config, capsys):
    from storage import jobs_table

    model = str(config.model_roots[0] / "dummy.safetensors")
    ids = []
    for _ in range(3):
        assert main(["submit", "load", "--model", model, "--json"]) == 0
        ids.append(json.loads(capsys.readouterr().out)["id"])
    assert main(["front", str(ids[2])]) == 0
    capsys.readouterr()
    assert jobs_table.claim_oldest(db, "test") == ids[2]  # the job moved to the front is taken first
    assert main(["front", str(ids[2]), "--json"]) == 2  # now running: only a queued job moves
    assert "not queued" in capsys.readouterr().out
    assert main(["clear", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"cancelled": ids[:2]}
    assert [j["status"] for j in list_jobs(db)] == ["running", "cancelled", "cancelled"]  # the running job runs on
    assert main(["clear"]) == 0 and capsys.readouterr().out == "cancelled 0 queued job(s)\n"
