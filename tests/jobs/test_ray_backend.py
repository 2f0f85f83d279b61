"""The Ray Jobs backend against a real one-machine Ray cluster (CPU): jobs submitted through
JobSubmissionClient, their samples, events, artifacts and ends written into SQLite here.

Marked `ray`; without ray installed they skip with the reason (DRAINBOARD_REQUIRE_RAY=1 fails them).
The cluster is shared by the module and stopped in teardown; the test that stops the head runs last.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from jobs.queue import cancel
from storage.artifacts import job_dir
from storage.queries import artifacts, events, get_job, last_sample, sample_count
from storage.schema import FINAL_STATUSES
from tests.jobs.ray_cluster import LocalCluster, require_ray, running, supervising

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _restore_main_module():
    """AppTest leaves the page as `__main__`; a later `spawn` child would re-run it (as tests/dashboard does)."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main


@pytest.fixture(scope="module")
def cluster():
    with running(LocalCluster(cpus=2)) as cluster:
        yield cluster


@pytest.fixture
def supervisor(config, cluster):
    """The conftest's supervisor (and so its tick_until and run_to_end), on the cluster."""
    with supervising(config, cluster) as sup:
        yield sup


def _final(db, job_id: int):
    return lambda: get_job(db, job_id)["status"] in FINAL_STATUSES


def _ray_pid(db, job_id: int) -> int | None:
    started = [e for e in events(db, job_id) if e["kind"] == "host"]
    return started[0]["data"]["pid"] if started else None


def test_a_load_and_a_generate_on_the_tiny_profile_run_through_ray_into_sqlite_and_the_job_page(
        db, config, queue_job, tick_until, tiny_model):
    load_id = queue_job("load", model=str(tiny_model), component="transformer")
    generate_id = queue_job("generate", model=str(tiny_model),
                            generate={"prompt": "a red fox", "frames": 124, "height": 64, "width": 64, "steps": 3})
    tick_until(_final(db, generate_id), timeout=300)
    load, generate = get_job(db, load_id), get_job(db, generate_id)
    assert load["status"] == "succeeded", load["error"]
    assert generate["status"] == "succeeded", generate["error"]

    assert last_sample(db, load_id)["tensors_placed"] == load["progress_total"] > 0  # a sample per tensor
    assert sample_count(db, load_id) >= load["progress_total"]
    assert load["metrics"]["tensors_placed"] == load["progress_total"]
    assert load["metrics"]["ray_submission_id"].startswith(f"drainboard-{load_id}-")
    [submitted] = [e for e in events(db, load_id) if e["kind"] == "ray"]
    assert submitted["data"]["entrypoint_num_gpus"] == 0
    assert [e["stage"] for e in events(db, load_id) if e["kind"] == "stage_start"] == ["probe", "load"]

    assert sample_count(db, generate_id) > 0 and last_sample(db, generate_id)["stage"] is not None
    assert generate["progress_done"] == generate["progress_total"] > 0  # the denoising steps, all done
    names = {a["name"]: a for a in artifacts(db, generate_id)}
    video = job_dir(config.data_dir, generate_id) / "video.mp4"
    assert video.stat().st_size == names["video.mp4"]["size"] > 0
    assert video.read_bytes()[4:8] == b"ftyp"
    log = (job_dir(config.data_dir, generate_id) / "child.log").read_text()
    assert "child.log" in names and "@drainboard" not in log and "Running entrypoint" in log

    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "job.py"), default_timeout=60)
    at.query_params["job"] = str(load_id)
    at.run()
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == [f"Job {load_id}"]
    labels = {m.label: m.value for m in at.metric}
    assert labels["Placed"].endswith("iB")
    specs = [json.loads(chart.proto.spec) for chart in at.get("vega_lite_chart")]
    assert specs, "the Job page draws the memory chart from the samples Ray sent"


def test_a_cancel_goes_to_ray_as_stop_job(db, queue_job, tick_until, monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "100000")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.02")
    job_id = queue_job("steps")
    tick_until(lambda: sample_count(db, job_id) >= 3)
    assert cancel(db, job_id) == "running"
    tick_until(_final(db, job_id), timeout=60)
    job = get_job(db, job_id)
    assert job["status"] == "cancelled" and "stop_job" in job["error"], job["error"]
    assert sample_count(db, job_id) >= 3


def test_a_child_killed_on_its_node_is_reported_with_its_last_sample(db, queue_job, tick_until, monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "100000")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.01")
    job_id = queue_job("steps")
    tick_until(lambda: sample_count(db, job_id) >= 5 and _ray_pid(db, job_id) is not None)
    os.kill(_ray_pid(db, job_id), signal.SIGKILL)  # the cluster is this machine: the node's child is a local pid
    tick_until(_final(db, job_id), timeout=60)
    job = get_job(db, job_id)
    assert job["status"] == "killed" and "SIGKILL" in job["error"], job["error"]
    quoted = int(re.search(r"tensor (\d+) of 100000", job["error"]).group(1))
    assert quoted == last_sample(db, job_id)["tensors_placed"] == sample_count(db, job_id)


def test_a_second_job_waits_in_the_queue_while_the_first_runs_on_ray_and_the_system_page_shows_where(
        db, queue_job, tick_until, cluster, monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "100")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.05")
    first, second = queue_job("steps"), queue_job("steps")
    tick_until(lambda: sample_count(db, first) >= 1)
    assert get_job(db, second)["status"] == "queued"

    from jobs.backends.ray_state import cluster_nodes

    [node] = cluster_nodes(cluster.address)
    assert (node.head, node.state, node.job) == (True, "ALIVE", str(first)) and node.memory > 0
    monkeypatch.setenv("DRAINBOARD_RAY_ADDRESS", cluster.address)
    st.cache_data.clear()  # the pages cache the config for 30 s: an earlier page's, without the address
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "system.py"), default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    assert "Ray cluster" in [h.value for h in at.subheader]
    [table] = [df.value for df in at.dataframe if "running job" in df.value.columns]
    assert table["node"].tolist() == [f"{node.ip} (head)"] and table["state"].tolist() == ["ALIVE"]

    tick_until(_final(db, second))
    assert [get_job(db, i)["status"] for i in (first, second)] == ["succeeded", "succeeded"]
    assert get_job(db, first)["finished_at"] <= get_job(db, second)["started_at"]
    assert sample_count(db, first) == sample_count(db, second) == 100


def test_the_memory_guard_runs_on_the_node_and_its_stop_is_reported_with_the_last_tensor(
        db, queue_job, run_to_end, monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "200")
    monkeypatch.setenv("DRAINBOARD_TEST_MIB", "8")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.03")
    job = run_to_end(queue_job("allocate", memory_budget="96MiB"), timeout=120)
    assert job["status"] == "killed", job["error"]
    assert re.match(r"memory guard: system in use grew .*, budget 96\.0 MiB on its Ray node, at tensor \d+ of 200",
                    job["error"]), job["error"]
    [guard] = [e for e in events(db, job["id"]) if e["kind"] == "memory_guard"]
    assert guard["data"]["reason"] == "budget" and guard["data"]["growth"] > 96 * 2**20
    assert job["metrics"]["memory_guard"]["growth"] == guard["data"]["growth"]
    assert last_sample(db, job["id"])["tensors_placed"] < 200
    [submitted] = [e for e in events(db, job["id"]) if e["kind"] == "ray"]
    assert submitted["data"]["entrypoint_memory"] == 96 * 2**20  # placed against Ray's memory resource


def test_protocol_lines_in_names_prompt_and_error_change_only_the_jobs_own_honest_record(
        db, config, queue_job, run_to_end, monkeypatch):
    import secrets

    from tests.jobs.kinds_for_tests import FORGED

    nonces, token_hex = [], secrets.token_hex
    monkeypatch.setattr(secrets, "token_hex", lambda n: nonces.append(token_hex(n)) or nonces[-1])
    first = run_to_end(queue_job("steps"))  # job 1, which the forged event names
    before = (events(db, first["id"]), artifacts(db, first["id"]), get_job(db, first["id"]))
    job = run_to_end(queue_job("forge"), timeout=120)
    assert job["status"] == "failed" and job["error"].startswith("ValueError: blocks.0"), job["error"]
    assert set(job["metrics"]) == {"ray_submission_id", "ray_host"}
    assert [e["kind"] for e in events(db, job["id"])] == ["ray", "host", "stage_start", "warning", "stage_end"]
    assert [a["name"] for a in artifacts(db, job["id"])] == ["child.log"]
    assert last_sample(db, job["id"])["tensor_name"] == f"blocks.0{FORGED}.weight"
    assert (events(db, first["id"]), artifacts(db, first["id"]), get_job(db, first["id"])) == before
    log = (job_dir(config.data_dir, job["id"]) / "child.log").read_text()
    assert log.count('@drainboard ["guard"') >= 2  # printed (and in the traceback), kept as output, obeyed by nobody
    assert len(nonces) == 2 and not any(nonce in log for nonce in nonces)  # Ray printed no secret in the log


def test_a_line_of_megabytes_reaches_the_tables_bounded_and_the_job_succeeds_with_its_metrics(
        db, queue_job, run_to_end, monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_MIB", "5")
    job = run_to_end(queue_job("long_lines"), timeout=120)
    assert job["status"] == "succeeded", job["error"]
    assert job["metrics"]["name_length"] == 5 * 2**20
    assert len(last_sample(db, job["id"])["tensor_name"]) == 5 * 2**20


class _BrokenStreamClient:
    """A Ray client whose log stream breaks after the job's first lines, as a 4 MiB line broke Ray's."""

    def __init__(self, status):
        self.status = status

    def submit_job(self, **arguments):
        self.arguments = arguments

    async def tail_job_logs(self, submission_id):
        yield "Running entrypoint for job x\n"
        raise RuntimeError("WebSocket error for job x: Message size 5242940 exceeds limit 4194304")

    def get_job_status(self, submission_id):
        return self.status

    def get_job_info(self, submission_id):
        return type("Info", (), {"message": "Job finished successfully.", "error_type": None,
                                 "driver_exit_code": 0})()


def test_a_broken_log_stream_fails_the_job_naming_why_though_ray_says_it_succeeded(db, config, queue_job):
    require_ray()
    from ray.job_submission import JobStatus

    from jobs.backends.ray_jobs import RayJobsBackend

    backend = RayJobsBackend(dataclasses.replace(config, ray_address="http://127.0.0.1:1"), db, "host:1:abcd")
    backend._client = _BrokenStreamClient(JobStatus.SUCCEEDED)
    job_id = queue_job("steps")
    backend.start(get_job(db, job_id))
    deadline = time.time() + 30
    while backend.watch(time.time()):
        assert time.time() < deadline
        time.sleep(0.05)
    job = get_job(db, job_id)
    assert job["status"] == "failed", job
    assert job["error"].startswith("the job's log stream from Ray broke (RuntimeError: WebSocket error for job x: "
                                   "Message size 5242940 exceeds limit 4194304); Ray says the job SUCCEEDED"), job["error"]


def test_the_head_stopped_mid_job_says_host_lost_and_the_queue_survives(
        db, queue_job, tick_until, supervisor, cluster, monkeypatch):
    """Runs last: it takes the module's cluster down and brings it back on the same ports."""
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "100000")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.02")
    job_id = queue_job("steps")
    tick_until(lambda: sample_count(db, job_id) >= 3)
    cluster.stop()
    tick_until(_final(db, job_id), timeout=60)
    job = get_job(db, job_id)
    assert job["status"] == "interrupted" and job["error"].startswith("host lost:"), job["error"]
    assert "last sample at" in job["error"] and sample_count(db, job_id) >= 3

    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "5")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0")
    waiting = queue_job("steps")
    deadline = time.time() + 3
    while time.time() < deadline:
        supervisor.tick()
        time.sleep(0.05)
    assert get_job(db, waiting)["status"] == "queued"  # no cluster: the job waits rather than fails
    cluster.start()
    tick_until(_final(db, waiting), timeout=120)
    assert get_job(db, waiting)["status"] == "succeeded", get_job(db, waiting)["error"]
