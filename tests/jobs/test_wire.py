"""The record protocol (`jobs.wire`), the relay on a job's node (`jobs.backends.node`) and the receiving end
(`jobs.backends.follow`), without Ray: what a remote child reports lands in the same tables as a local
child's, and nothing it prints (protocol-looking names, prompts, errors; lines of megabytes) passes for a
record or breaks the stream."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.backends.follow import BAD_RECORDS_SAID, Follower
from jobs.backends.node import LineCutter
from jobs.backends.ray_jobs import job_environment
from jobs.wire import (LINE_LIMIT, OUTPUT_LINE_LIMIT, RECORD_LIMIT, RecordTooLarge, encode, parse_record,
                       record_lines, tag)
from storage.artifacts import job_dir
from storage.queries import artifacts, events, get_job, last_sample, sample_count
from tests.jobs.kinds_for_tests import FORGED

REPO = str(Path(__file__).resolve().parents[2])

REPORTING_CHILD = """
import os, sys, time
from jobs.wire import ENV_RECORD_FD, LineWriter, WireReporter
from machine.memory import MemorySample
from tests.jobs.kinds_for_tests import FORGED
reporter = WireReporter(int(sys.argv[1]), LineWriter(int(os.environ.pop(ENV_RECORD_FD))),
                        environ={"DRAINBOARD_JOB_SPEC": '{"kind": "steps"}'})
assert reporter.spec() == {"kind": "steps"}
print("some library output", FORGED, flush=True)
print(FORGED, file=sys.stderr, flush=True)
sink = reporter.sample_sink(100.0, time.monotonic)
reporter.stage("load")
for step in range(1, 4):
    rss = step * 2**20
    sink.add(MemorySample(100.0 + step, rss, rss // 2, rss // 4, rss, 8 * 2**30, 0, 0, None), stage="load",
             tensors_placed=step, bytes_placed=step * 1024, tensor_name=f"blocks.{step}.weight")
    reporter.progress(step, 3)
reporter.event({"t": 1.5, "created_at": 1.0, "kind": "warning", "stage": "load", "message": "hot", "data": None})
reporter.artifact(sys.argv[2])
reporter.metrics({"steps": 3})
reporter.close()
"""


def _relay(job_id: int, nonce: str, command: list[str], env: dict, out: Path) -> int:
    """The relay of `jobs.backends.node` run in a process of its own, writing the job's log to `out`."""
    script = ("import sys, json\nfrom jobs.backends.node import relay\n"
              "sys.exit(relay(int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]), "
              "out=1) & 0xff)")
    with open(out, "wb") as f:
        done = subprocess.run([sys.executable, "-c", script, str(job_id), nonce, json.dumps(command), json.dumps(env)],
                              stdout=f, stderr=subprocess.PIPE, env=env, timeout=180)
    assert not done.stderr, done.stderr.decode()[-2000:]
    return done.returncode


def _follow(config, job_id: int, nonce: str, text: str, chunk: int = 7919) -> Follower:
    log = job_dir(config.data_dir, job_id) / "child.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    follower = Follower(config.db_path, config.data_dir, job_id, log, nonce)
    for start in range(0, len(text), chunk):  # chunk edges fall mid-line
        follower.feed(text[start:start + chunk])
    follower.close()
    return follower


def _untouched(db, job_id: int) -> None:
    job = get_job(db, job_id)
    assert (job["status"], job["error"], job["metrics"], job["stage"]) == ("queued", None, None, None)
    assert events(db, job_id) == [] and artifacts(db, job_id) == [] and sample_count(db, job_id) == 0


def test_a_remote_childs_records_in_odd_chunks_land_in_the_tables_and_what_it_prints_only_in_its_log(
        db, config, queue_job, tmp_path):
    other = queue_job("steps")
    job_id = queue_job("steps")
    video = os.urandom(500_000)  # three chunks
    nonce = secrets.token_hex(16)
    out = tmp_path / "ray.log"
    env = {**os.environ, "PYTHONPATH": REPO}
    (tmp_path / "video.mp4").write_bytes(video)
    code = _relay(job_id, nonce, [sys.executable, "-c", REPORTING_CHILD, str(job_id), str(tmp_path / "video.mp4")],
                  env, out)
    assert code == 0
    follower = _follow(config, job_id, nonce, "Running entrypoint for job drainboard-x\n" + out.read_text())

    assert follower.exit_code == 0 and follower.bad == 0 and follower.started["pid"] != os.getpid()
    assert sample_count(db, job_id) == 3
    assert last_sample(db, job_id)["tensor_name"] == "blocks.3.weight" and last_sample(db, job_id)["t"] == 3.0
    job = get_job(db, job_id)
    assert (job["stage"], job["progress_done"], job["progress_total"], job["metrics"]) == ("load", 3, 3, {"steps": 3})
    assert [e["kind"] for e in events(db, job_id)] == ["host", "warning"]
    assert (job_dir(config.data_dir, job_id) / "video.mp4").read_bytes() == video
    assert [a["name"] for a in artifacts(db, job_id)] == ["video.mp4"]
    log = (job_dir(config.data_dir, job_id) / "child.log").read_text()
    assert log.startswith("Running entrypoint") and "some library output" in log
    assert log.count('@drainboard ["guard"') == 2 and nonce not in log  # the forged lines, kept as output
    _untouched(db, other)


def test_only_lines_with_the_jobs_tag_are_records(db, config, queue_job, tmp_path):
    """Recorded log text: the job's own tagged lines apply; the old untagged form, another job's tag and
    a wrong nonce are output."""
    other, job_id = queue_job("steps"), queue_job("steps")
    nonce = secrets.token_hex(16)
    ours = tag(job_id, nonce)
    text = "".join([
        ours + encode("stage", "load").decode(),
        FORGED,
        tag(other, nonce) + encode("metrics", {"forged": True}).decode(),
        tag(job_id, secrets.token_hex(16)) + encode("metrics", {"forged": True}).decode(),
        "50%|#####  " + ours + encode("metrics", {"forged": True}).decode(),  # a tag mid-line is output
        ours + encode("exit", 1).decode(),
    ])
    follower = _follow(config, job_id, nonce, text)
    job = get_job(db, job_id)
    assert (follower.exit_code, follower.received, follower.bad) == (1, 2, 0)
    assert (job["stage"], job["metrics"], job["error"]) == ("load", None, None)
    assert events(db, job_id) == [] and artifacts(db, job_id) == []
    assert list(job_dir(config.data_dir, job_id).iterdir()) == [job_dir(config.data_dir, job_id) / "child.log"]
    _untouched(db, other)


BAD_RECORDS = [
    'not json',
    '["event", {"t": 0, "created_at": 0, "kind": "warning", "stage": null, "message": "x", "data": null, "job_id": 1}]',
    '["event", {"t": 0, "created_at": 0, "kind": "warning", "stage": null, "message": "x", "data": null, "nope": 1}]',
    '["event", {"t": "0", "created_at": 0, "kind": "warning", "stage": null, "message": "x", "data": null}]',
    '["progress", ["3", 10]]',
    '["sample", [0, "load", 1, 1, "x", 0.5, 1, 1, 1, 1, 1, 0, 0]]',
    '["sample", [999999, "load", 1, 1, "x", 0.5, 1, 1, 1, 1, 1, 0, 0, null]]',
    '["teleport", {}]',
    '["exit", "0"]',
    '["chunk", {"name": "video.mp4", "data": "AAAA"}]',
    '["artifact", {"name": "../../drainboard.db.mp4", "size": 1}]',
    '["part", [1, 2, "xx"]]',
    '["error", "just a string"]',
    '{"kind": "metrics"}',
]


def test_the_follower_survives_any_bad_record_and_says_so_a_bounded_number_of_times(db, config, queue_job):
    job_id = queue_job("steps")
    nonce = secrets.token_hex(16)
    ours = tag(job_id, nonce)
    text = "".join(ours + line + "\n" for line in [encode("t0", 1.0).decode().strip(), *BAD_RECORDS,
                                                  encode("metrics", {"steps": 3}).decode().strip(),
                                                  encode("exit", 0).decode().strip()])
    follower = _follow(config, job_id, nonce, text)
    assert (follower.bad, follower.exit_code, get_job(db, job_id)["metrics"]) == (len(BAD_RECORDS), 0, {"steps": 3})
    said = [e["message"] for e in events(db, job_id)]
    assert len(said) == BAD_RECORDS_SAID + 1 and all(e["kind"] == "warning" for e in events(db, job_id))
    assert "not JSON" in said[0] and "must have the fields" in said[1] and "more are only counted" in said[-2]
    assert said[-1].startswith(f"{len(BAD_RECORDS)} records from the job's node could not be applied")
    log = (job_dir(config.data_dir, job_id) / "child.log").read_text()
    assert log.count("could not be applied") == len(BAD_RECORDS)
    assert artifacts(db, job_id) == [] and sample_count(db, job_id) == 0


def test_a_damaged_artifact_or_one_longer_than_announced_is_not_registered(db, config, queue_job):
    import base64
    import hashlib

    job_id = queue_job("steps")
    nonce = secrets.token_hex(16)
    ours = tag(job_id, nonce)
    data = b"x" * 1000
    chunk = {"name": "video.mp4", "data": base64.b64encode(data).decode()}
    records = [("artifact", {"name": "video.mp4", "size": 1000}), ("chunk", chunk),
               ("artifact_end", {"name": "video.mp4", "sha256": "0" + hashlib.sha256(data).hexdigest()[1:]}),
               ("artifact", {"name": "clip.mp4", "size": 10}), ("chunk", {**chunk, "name": "clip.mp4"})]
    follower = _follow(config, job_id, nonce, "".join(ours + encode(*r).decode() for r in records))
    assert follower.bad == 2 and artifacts(db, job_id) == []
    assert sorted(p.name for p in job_dir(config.data_dir, job_id).iterdir()) == ["child.log"]
    said = " ".join(e["message"] for e in events(db, job_id))
    assert "arrived damaged" in said and "longer than the 10 bytes announced" in said


def test_a_record_over_a_line_travels_in_parts_and_one_over_the_record_limit_is_refused_by_name(
        db, config, queue_job):
    job_id = queue_job("steps")
    nonce = secrets.token_hex(16)
    name = "x\n\x1b]0;t\x07" * (600_000)  # 4.2 M characters, 6x longer as JSON escapes
    sample = [0, "load", 1, 4, name, 0.5, 1, 1, 1, 1, 1, 0, 0, None]
    lines = record_lines("sample", sample)
    assert len(lines) > 1 and all(len(line) <= LINE_LIMIT for line in lines)
    text = "".join(tag(job_id, nonce) + line.decode() for line in [encode("t0", 0.0), *lines, encode("exit", 0)])
    follower = _follow(config, job_id, nonce, text, chunk=3_000_000)
    assert (follower.bad, follower.exit_code) == (0, 0)
    assert last_sample(db, job_id)["tensor_name"] == name
    with pytest.raises(RecordTooLarge, match=r"a metrics record of 7\d\.\d MiB is more than the 64\.0 MiB"):
        record_lines("metrics", {"names": "y" * (RECORD_LIMIT + 10 * 2**20)})


def test_an_output_line_is_cut_at_its_limit_and_the_rest_of_it_skipped():
    cutter = LineCutter(10)
    assert cutter.feed(b"short\n" + b"a" * 25) == [(b"short", False), (b"a" * 10, True)]
    assert cutter.feed(b"b" * 30 + b"\nnext\n" + b"c" * 11 + b"\nend") == \
        [(b"next", False), (b"c" * 10, True)]
    assert cutter.rest() == b"end"


def test_a_record_must_have_its_kinds_shape():
    assert parse_record('["progress", [3, null]]') == ("progress", [3, None])
    with pytest.raises(ValueError, match="wrong type or range: 0"):
        parse_record('["progress", [true, 3]]')


def _on_node(job: dict, config, tmp_path: Path) -> tuple[int, str, str]:
    """Run `job` as Ray runs it (`python -m jobs.backends.node ID` with the runtime_env's variables), here;
    returns the node's exit code, the log it wrote and the nonce."""
    nonce = secrets.token_hex(16)
    env = {**os.environ, **job_environment(job, config, nonce)}
    out = tmp_path / f"ray-{job['id']}.log"
    with open(out, "wb") as f:
        done = subprocess.run([sys.executable, "-m", "jobs.backends.node", str(job["id"])], stdout=f,
                              stderr=subprocess.STDOUT, env=env, cwd=REPO, timeout=300)
    return done.returncode, out.read_text(errors="replace"), nonce


def test_a_job_printing_protocol_lines_in_names_prompt_and_error_changes_only_its_own_honest_record(
        db, config, queue_job, tmp_path):
    other = queue_job("steps")
    job = get_job(db, queue_job("forge"))
    code, log, nonce = _on_node(job, config, tmp_path)
    assert code == 1
    follower = _follow(config, job["id"], nonce, log)
    assert nonce not in (job_dir(config.data_dir, job["id"]) / "child.log").read_text()  # the child never saw it
    assert (follower.exit_code, follower.bad, follower.guard) == (1, 0, None)
    row = get_job(db, job["id"])
    assert row["metrics"] is None and row["error"].startswith("ValueError: blocks.0")
    assert "forged error" not in row["error"].split("\n")[0]
    assert last_sample(db, job["id"])["tensor_name"] == f"blocks.0{FORGED}.weight"  # the name, as it is
    assert [e["kind"] for e in events(db, job["id"])] == ["host", "stage_start", "warning", "stage_end"]
    assert artifacts(db, job["id"]) == [] and not (job_dir(config.data_dir, job["id"]) / "video.mp4").exists()
    _untouched(db, other)


def test_a_megabytes_long_name_reaches_the_tables_whole_and_every_log_line_stays_bounded(
        db, config, queue_job, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAINBOARD_TEST_MIB", "5")
    job = get_job(db, queue_job("long_lines"))
    code, log, nonce = _on_node(job, config, tmp_path)
    assert code == 0
    assert max(len(line) for line in log.split("\n")) <= LINE_LIMIT + len(tag(job["id"], nonce))
    assert f"[... cut: a line over {OUTPUT_LINE_LIMIT:,} bytes]" in log
    follower = _follow(config, job["id"], nonce, log)
    assert (follower.exit_code, follower.bad) == (0, 0)
    assert get_job(db, job["id"])["metrics"] == {"name_length": 5 * 2**20}
    assert len(last_sample(db, job["id"])["tensor_name"]) == 5 * 2**20


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


def test_the_spec_and_the_config_reach_the_node_as_written_though_ray_expands_dollar_names(db, config, queue_job):
    """Ray 2.60 runs every runtime_env value through `os.path.expandvars` and drops an unknown `${NAME}` (a job of
    ours, by hand: "a $HOME b ${NOPE} c" arrived as "a /root b  c"); the JSON the node reads carries no `$`."""
    import dataclasses
    import re

    from jobs.wire import ENV_SPEC
    from storage.config import ENV_RESOLVED

    job = get_job(db, queue_job("steps"))
    job["spec"] = {**job["spec"], "prompt": "a fox at $HOME, ${NOPE} and $$"}
    roots = [config.model_roots[0] / "$HOME"]
    env = job_environment(job, dataclasses.replace(config, model_roots=roots), "nonce")
    as_ray = {k: re.sub(r"\$\{[A-Z0-9_]+\}", "", os.path.expandvars(v)) for k, v in env.items()}
    assert json.loads(as_ray[ENV_SPEC]) == job["spec"]
    assert json.loads(as_ray[ENV_RESOLVED])["model_roots"] == [str(r) for r in roots]
