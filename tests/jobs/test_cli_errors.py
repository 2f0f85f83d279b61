"""The jobs CLI on bad input: exit 2 naming the field (JSON with --json, usage errors included), never rc 1."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import jobs.cli
from jobs.cli import main
from jobs.presence import REPO_ROOT
from storage import jobs_table
from storage.config import load_config
from storage.schema import open_database
from storage.queries import get_job, list_jobs

pytestmark = pytest.mark.usefixtures("launched_workers")  # submits here start no real worker


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


@pytest.mark.parametrize("command", ["show", "cancel", "retry"])
def test_a_job_id_beyond_sqlite_is_refused_naming_the_argument(db, capsys, command):
    code, out = run_json(capsys, command, str(10**30))
    assert code == 2 and out["ok"] is False
    assert out["errors"] == [f"python -m jobs {command}: argument id: expected a whole number from 1 to "
                             f"9223372036854775807, got '{10**30}'"]
    assert main([command, "²"]) == 2
    assert "argument id: expected a whole number" in capsys.readouterr().err


@pytest.mark.slow
def test_a_prompt_with_a_byte_that_is_not_utf8_exits_2_naming_the_prompt(config, tiny_model):
    result = subprocess.run(
        [sys.executable, "-m", "jobs", "submit", "generate", "--model", str(tiny_model), "--prompt", b"a \xff fox",
         "--json"], cwd=REPO_ROOT, env=dict(os.environ), capture_output=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr.decode(errors="replace")
    assert json.loads(result.stdout)["errors"] == ["generate.prompt: is not valid UTF-8 text: byte 0xff at position 2"]


def test_cuda_on_a_machine_without_it_is_refused_at_submit(db, config, capsys, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    code, out = run_json(capsys, "submit", "load", "--model", str(config.model_roots[0] / "dummy.safetensors"),
                         "--device", "cuda")
    assert code == 2 and out["errors"][0].startswith("device: 'cuda' is not available here: this torch")
    assert list_jobs(db) == []


def test_an_unknown_component_is_refused_at_submit_listing_the_checkpoints(db, config, capsys, tiny_model):
    code, out = run_json(capsys, "submit", "load", "--model", str(tiny_model), "--component", "transfomer")
    assert code == 2 and out["errors"] == [
        f"component: {tiny_model} has no component 'transfomer'; known: audio_vae, text_encoder, transformer, transformer_ref, vae"
    ]
    assert list_jobs(db) == []


@pytest.mark.parametrize("argv, expected", [
    (["list", "--status", "faild"], "argument --status: invalid choice: 'faild' (choose from 'queued', 'running', "
                                    "'succeeded', 'failed', 'killed', 'cancelled', 'interrupted')"),
    (["list", "--kind", "lod"], "argument --kind: invalid choice: 'lod' (choose from "),
    (["list", "--limit", "0"], "argument --limit: expected a whole number from 1 to"),
    (["submit", "load"], "the following arguments are required: --model"),
    (["submit", "lod", "--model", "x"], "argument KIND: invalid choice: 'lod'"),
    (["show"], "the following arguments are required: id"),
])
def test_usage_errors_with_json_print_the_json_error_object(db, capsys, argv, expected):
    code, out = run_json(capsys, *argv)
    assert code == 2 and out["ok"] is False and len(out["errors"]) == 1
    assert expected in out["error"], out["error"]


def test_usage_errors_without_json_print_usage_and_one_error_line(db, capsys):
    assert main(["list", "--status", "faild"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert lines[0].startswith("usage: python -m jobs list") and lines[-1].startswith("error: python -m jobs list:")


def test_list_has_a_header_timestamps_and_one_line_errors(db, config, capsys, queue_job):
    failed = queue_job("steps")
    jobs_table.finish(db, failed, "failed", now=get_job(db, failed)["created_at"] + 5,
                      error="CheckpointError: 20 problems:\n  " + "\n  ".join(f"shard {i} is truncated" for i in range(20)))
    queue_job("steps")
    assert main(["list"]) == 0
    header, newest, older = capsys.readouterr().out.splitlines()
    assert header.split() == ["ID", "KIND", "STATUS", "CREATED", "FINISHED", "MODEL", "ERROR"]
    assert newest.split()[:3] == ["2", "steps", "queued"] and newest.split()[5] == "-"
    assert older.split()[:3] == ["1", "steps", "failed"]
    assert older.endswith("CheckpointError: 20 problems: …")
    created = older.split()[3:5]
    assert len(created[0]) == 10 and created[0][4] == "-" and created[1].count(":") == 2


def test_wait_gives_up_with_a_message_when_no_worker_ever_starts(db, config, capsys, monkeypatch):
    import jobs.presence

    monkeypatch.setattr(jobs.presence, "ensure_supervisor", lambda config: {"alive": False})
    monkeypatch.setattr(jobs.cli, "NO_WORKER_DEADLINE", 0.5)
    code = main(["submit", "load", "--model", str(config.model_roots[0] / "dummy.safetensors"), "--wait", "--json"])
    captured = capsys.readouterr()
    assert code == 1 and json.loads(captured.out)["status"] == "queued"
    assert "no worker has been alive for 0.5 s, so job 1 is still queued; start one with `python -m jobs worker`" \
        in captured.err


def fill(folder) -> None:
    with open(folder / "filler", "wb") as f:
        f.write(b"\0" * shutil.disk_usage(folder).free)


@pytest.mark.parametrize("argv", [["submit", "load", "--model", "MODEL", "--json"], ["worker", "--once"]])
@pytest.mark.parametrize("held_open, cause", [(True, "database or disk is full"), (False, "disk I/O error")])
def test_submit_and_worker_on_a_full_disk_say_disk_full_where_and_how_much_is_free(
    config, capsys, monkeypatch, small_tmpfs, argv, held_open, cause
):
    """Held open by a reader, the database's WAL files exist and the first write fails SQLITE_FULL;
    closed, opening it cannot even create them ("disk I/O error"). Both are a full disk to the user."""
    disk = small_tmpfs(1024 * 1024, name="full")
    monkeypatch.setenv("DRAINBOARD_DATA", str(disk / "data"))
    monkeypatch.setenv("DRAINBOARD_MODEL_ROOTS", str(config.model_roots[0]))
    full = load_config()
    reader = open_database(full.db_path)
    if not held_open:
        reader.conn.close()
    fill(disk)
    model = str(config.model_roots[0] / "dummy.safetensors")
    handler = signal.getsignal(signal.SIGTERM)
    try:
        code = main([model if word == "MODEL" else word for word in argv])
    finally:
        reader.conn.close()
    assert signal.getsignal(signal.SIGTERM) is handler  # a worker whose start failed gives SIGTERM back
    captured = capsys.readouterr()
    message = json.loads(captured.out)["error"] if "--json" in argv else captured.err.splitlines()[-1]
    assert code == 2, captured
    assert message.removeprefix("error: ") == \
        f"disk full: cannot write to the database {full.db_path} (0 bytes free): {cause}"


@pytest.mark.parametrize("argv", [
    ["jobs", "list"], ["loader", "inspect", "MODEL"], ["models", "synth", "OUT", "--profile", "tiny", "--dry-run"],
])
@pytest.mark.slow
def test_a_closed_stdout_ends_quietly(config, queue_job, tiny_model, tmp_path, argv):
    for _ in range(3):
        queue_job("steps")
    argv = [str(tiny_model) if w == "MODEL" else str(tmp_path / "out") if w == "OUT" else w for w in argv]
    read, write = os.pipe()
    os.close(read)  # the reader (`| head`) is gone before the command prints anything
    try:
        result = subprocess.run([sys.executable, "-m", *argv], cwd=REPO_ROOT, env=dict(os.environ), stdout=write,
                                stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert result.returncode == 141 and "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, \
        result.stderr
