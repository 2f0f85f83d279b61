"""Process-wide settings (`loader.process`): an entry point makes them; importing or calling the library does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import loader.process

ROOT = Path(__file__).resolve().parents[2]

_LIBRARY_USER = """
import json, os, sys
import torch
import models, models.run.pipeline, models.checkpoint.components, models.synth.writer
import loader, loader.api, loader.io.host_blocks as host_blocks
import jobs.kinds.load, jobs.kinds.generate
from machine.host_heap import return_large_frees_to_os
arena = host_blocks.PinnedHostArena(1 << 20)
arena.empty((16,), torch.float32)  # a library call that pins where CUDA is
before = {"offline": os.environ.get("HF_HUB_OFFLINE"), "mmap": return_large_frees_to_os.cache_info().currsize,
          "pinned": host_blocks._register_mode}
from loader.process import configure_process
configure_process(sys.argv[1])
after = {"offline": os.environ.get("HF_HUB_OFFLINE"), "mmap": return_large_frees_to_os.cache_info().currsize,
         "pinned": host_blocks._register_mode}
print(json.dumps({"before": before, "after": after}))
"""


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_importing_and_calling_the_library_changes_no_process_setting_and_configure_process_makes_them(device):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    out = subprocess.run([sys.executable, "-c", _LIBRARY_USER, device], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["before"] == {"offline": None, "mmap": 0, "pinned": None}
    assert seen["after"]["offline"] == "1" and seen["after"]["mmap"] == 1
    # the pinned-allocator switch is asked for on a CUDA device only (this machine may have none: then False)
    assert (seen["after"]["pinned"] is None) is (device == "cpu")


def test_made_first_the_hub_client_reads_offline_when_the_pipeline_imports_it():
    """huggingface_hub reads HF_HUB_OFFLINE once, when it is imported: an entry point sets it before that."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    script = ("from loader.process import configure_process; configure_process(); import models.run.pipeline, "
              "models.synth.writer; import huggingface_hub.constants as c; print(c.HF_HUB_OFFLINE)")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split()[-1] == "True", out.stderr


class _Configured(Exception):
    """Raised by the recording `configure_process`, to stop an entry point right after it."""


@pytest.fixture
def calls(monkeypatch) -> list[tuple]:
    seen: list[tuple] = []

    def record(*args):
        seen.append(args)

    for module in ("loader.cli", "models.cli", "jobs.cli", "jobs.child", "loader.sharded.worker", "models.parallel.launch"):
        monkeypatch.setattr(f"{module}.configure_process", record)
    monkeypatch.setattr(loader.process, "configure_process", record)
    return seen


@pytest.mark.parametrize("module", ["loader.cli", "models.cli", "jobs.cli"])
def test_every_command_line_makes_the_settings_first(calls, module, capsys):
    import importlib

    with pytest.raises(SystemExit) as exit:
        importlib.import_module(module).main(["--help"])
    assert exit.value.code == 0 and calls == [()]


def test_a_load_command_adds_its_device_settings(calls, tmp_path, monkeypatch):
    import loader.cli

    def refuse(*args, **kwargs):
        raise _Configured

    monkeypatch.setattr(loader.cli, "load_checkpoint", refuse)
    assert loader.cli.main(["load", str(tmp_path), "--device", "cpu"]) != 0
    assert calls == [(), ("cpu",)]


def test_the_job_child_makes_the_settings_before_the_job(calls, monkeypatch):
    import jobs.child

    monkeypatch.setattr(jobs.child, "run_job", lambda job_id: 0 if calls == [()] else 1)
    assert jobs.child.main(7) == 0


def test_the_sharded_worker_makes_its_device_settings(calls, tmp_path, monkeypatch):
    import loader.sharded.worker as worker

    monkeypatch.setattr(worker, "rank_device", lambda device: (_ for _ in ()).throw(_Configured()))
    with pytest.raises(_Configured):
        worker.main([str(tmp_path), "--out", str(tmp_path), "--device", "cpu"])
    assert calls == [("cpu",)]


def test_a_parallel_generates_rank_makes_its_device_settings(calls, tmp_path, monkeypatch):
    import json

    import machine.lifetime
    import models.parallel.rank
    import models.parallel.launch

    monkeypatch.setattr(machine.lifetime, "die_with_parent", lambda: None)
    monkeypatch.setattr(models.parallel.rank, "RankGroup", lambda *a: (_ for _ in ()).throw(_Configured()))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")  # as every launcher sets it, local or Ray
    monkeypatch.setenv(models.parallel.launch.PARENT_ENV, str(os.getppid()))  # as the parent that started the ranks sets it
    (tmp_path / "request.json").write_text(json.dumps({"device": "cpu"}))
    with pytest.raises(_Configured):
        models.parallel.launch.rank_main(tmp_path, 1)
    assert calls == [("cpu",)]


def test_the_fork_server_makes_the_settings_before_its_imports(monkeypatch):
    import jobs.forkserver
    import machine.lifetime

    order: list[str] = []
    monkeypatch.setattr(machine.lifetime, "die_with_parent", lambda: None)
    monkeypatch.setattr(loader.process, "configure_process", lambda *a: order.append("configure"))
    monkeypatch.setattr(jobs.forkserver, "PRELOAD", ("json",))
    monkeypatch.setattr("importlib.import_module", lambda name: order.append(name))
    monkeypatch.setattr(jobs.forkserver, "serve", lambda sock: order.append("serve"))
    monkeypatch.setattr(jobs.forkserver.gc, "freeze", lambda: None)  # this test process stays as it is
    a, b = __import__("socket").socketpair()
    monkeypatch.setenv(jobs.forkserver.ENV_SOCKET_FD, str(a.detach()))
    try:
        jobs.forkserver.main()
    finally:
        b.close()
    assert order == ["configure", "json", "serve"]


def test_the_dashboard_makes_the_settings_before_its_pages(calls):
    from streamlit.testing.v1 import AppTest

    def stop(*args):
        calls.append(args)
        raise _Configured

    loader.process.configure_process = stop  # the fixture restores it
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    assert calls == [()] and at.exception
