"""`python -m loader inspect/load`: one JSON object on stdout, one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loader.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]
REPORT_KEYS = {
    "mode", "device", "tensors_total", "tensors_placed", "bytes_placed", "bytes_read", "load_seconds",
    "throughput_gbps", "footprint_ratio", "host_peak_ratio", "memavailable_cost_ratio",
    "peak_device_allocated_bytes", "loaded", "missing", "unexpected", "skipped",
}


def test_inspect_json_describes_components_tensors_bytes_and_dtypes(tiny_checkpoint, capsys):
    assert main(["inspect", str(tiny_checkpoint.path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    (component,) = summary["components"]
    assert component["tensors"] == len(tiny_checkpoint.tensors) and component["shards"] == 3
    assert component["bytes"] == sum(t.nbytes for t in tiny_checkpoint.tensors.values())
    assert set(component["dtypes"]) == {"BF16", "F16", "F32", "I64"}


def test_inspect_text_names_each_component(tiny_checkpoint, capsys):
    assert main(["inspect", str(tiny_checkpoint.path)]) == 0
    assert "tiny: 8 tensors in 3 shard(s)" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["stream", "drain", "retain"])
def test_load_json_prints_one_report_with_the_design_metric_names(tiny_checkpoint, capsys, mode):
    assert main(["load", str(tiny_checkpoint.path), "--mode", mode, "--dtype", "fp16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert REPORT_KEYS <= set(report)
    assert report["mode"] == mode and report["device"] == "cpu" and report["tensors_placed"] == 8


def test_a_malformed_checkpoint_exits_2_with_one_line_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    result = subprocess.run(
        [sys.executable, "-m", "loader", "load", str(bad)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: bad.safetensors: header")


def test_errors_under_json_are_one_object_on_stdout(tmp_path, capsys):
    assert main(["load", str(tmp_path / "missing"), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and "no such file or directory" in out["error"] and len(out["errors"]) == 1


def test_an_unavailable_device_is_an_expected_error(tiny_checkpoint, capsys):
    assert main(["load", str(tiny_checkpoint.path), "--device", "tpu"]) == 2
    assert "device spec 'tpu' is not understood" in capsys.readouterr().err


def test_every_subcommand_has_help_with_an_example():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert {"inspect", "load", "device"} <= set(subparsers.choices)
    for name in ("inspect", "load"):
        assert "example: python -m loader " + name in subparsers.choices[name].format_help()


def test_load_in_an_mmap_mode_on_unified_cuda_warns_in_one_stderr_line_first(tiny_checkpoint, capsys, monkeypatch):
    """The device is forced unified (no GPU here, so the load itself then fails on the device)."""
    monkeypatch.setenv("DRAINBOARD_UNIFIED_MEMORY", "1")
    main(["load", str(tiny_checkpoint.path), "--mode", "drain", "--device", "cuda", "--json"])
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("warning: mode drain reads through mmap views") and "stream, the default" in err[0]
    main(["load", str(tiny_checkpoint.path), "--mode", "stream", "--device", "cuda", "--json"])
    assert "warning" not in capsys.readouterr().err
