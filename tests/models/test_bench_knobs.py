"""bench/bench_knobs.py on the tiny checkpoint: one JSON row per case, the fp32 reference at infinite PSNR."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_knobs.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_knobs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vae_rows_compare_bf16_and_untiled_against_fp32_tiled(h3_tiny: Path, capsys):
    assert _bench().main(["vae", str(h3_tiny), "--untiled"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["case"] for r in rows] == ["vae fp32 tiled", "vae bf16 tiled", "vae fp32 untiled"]
    assert rows[2]["psnr_vs_fp32_tiled_db"] == float("inf")  # 128x64 fits in one 256 px tile: tiling changes nothing
    assert rows[0]["psnr_vs_fp32_tiled_db"] == float("inf")
    assert 10 < rows[1]["psnr_vs_fp32_tiled_db"] < float("inf")
    assert all(r["decode_s"] > 0 and r["peak_bytes"] > 0 and r["canvas"] == [128, 64] for r in rows)  # the default canvas


def test_quant_rows_give_the_dit_bytes_and_psnr_against_bf16(h3_tiny: Path, capsys):
    pytest.importorskip("torchao", reason="torchao is the optional quantization dependency")
    assert _bench().main(["quant", str(h3_tiny), "--height", "64", "--width", "64", "--steps", "2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["case"] for r in rows] == ["dit bf16", "dit int8"]
    assert rows[1]["dit_bytes"] < rows[0]["dit_bytes"] and rows[0]["psnr_vs_bf16_db"] == float("inf")
    assert 0 < rows[1]["psnr_vs_bf16_db"] < float("inf")
