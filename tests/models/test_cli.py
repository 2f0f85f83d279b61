"""`python -m models`: one JSON object on stdout with --json, exit 2 with the error shape on bad input."""

from __future__ import annotations

import json
from pathlib import Path

from models.cli import build_parser, main


def test_synth_dry_run_json_prints_the_pruned_dit_counts(capsys, tmp_path: Path):
    assert main(["synth", str(tmp_path / "h3"), "--profile", "h3-pruned-r16", "--dry-run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    dit = report["components"][0]
    assert (dit["tensors"], dit["parameters"], dit["bytes"]) == (639, 20_166_101_760, 40_332_203_520)
    assert not (tmp_path / "h3").exists()


def test_generate_with_bad_params_exits_2_with_the_error_shape(capsys, tiny_model: Path, tmp_path: Path):
    code = main(["generate", str(tiny_model), "--prompt", "fox", "--out", str(tmp_path / "c.mp4"),
                 "--frames", "10", "--width", "100", "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 2 and body["ok"] is False
    assert body["errors"] == ["frames: 10 is not 1 + 4 * k (e.g. 33 or 121)",
                              "width: 100 is not a positive multiple of 16 (VAE factor x patch size)"]


def test_every_command_has_help_with_an_example():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        assert "example: python -m models " + name in parser.format_help()
