"""Footprint per mode on a >= 1 GiB checkpoint in several shards, each load in a fresh process.

The measurement must see the problem (retain about 2x) and the fixes
(drain about one shard over the model, stream about the model alone).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.safetensors_stream import write_tensors

REPO = Path(__file__).resolve().parents[2]
SHARDS = 8
TENSORS_PER_SHARD = 4
SHAPE = (2048, 4096)  # 32 MiB of fp32 per tensor, 128 MiB per shard, 1 GiB in all


@pytest.fixture(scope="session")
def gib_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1 GiB of seeded random fp32 (never zeros) in 8 shards of 4 tensors each, with an index."""
    g = torch.Generator().manual_seed(1234)
    shards = [
        {f"blocks.{s}.linear{i}.weight": torch.randn(SHAPE, generator=g) for i in range(TENSORS_PER_SHARD)}
        for s in range(SHARDS)
    ]
    return write_tensors(tmp_path_factory.mktemp("gib") / "transformer", shards)


def _load_in_fresh_process(path: Path, mode: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "loader", "load", str(path), "--mode", mode, "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _largest_shard_fraction(path: Path) -> float:
    sizes = [p.stat().st_size for p in path.glob("*.safetensors")]
    return max(sizes) / sum(sizes)


def test_retain_footprint_shows_the_whole_checkpoint_kept_mapped(gib_checkpoint):
    report = _load_in_fresh_process(gib_checkpoint, "retain")
    assert report["bytes_placed"] >= 1 << 30
    assert report["footprint_ratio"] >= 1.8, report


def test_drain_footprint_stays_within_one_shard_of_the_model(gib_checkpoint):
    report = _load_in_fresh_process(gib_checkpoint, "drain")
    assert report["footprint_ratio"] <= 1 + _largest_shard_fraction(gib_checkpoint) + 0.05, report


def test_stream_footprint_is_the_model_alone(gib_checkpoint):
    report = _load_in_fresh_process(gib_checkpoint, "stream")
    assert report["footprint_ratio"] <= 1.05, report
    assert report["tensors_placed"] == SHARDS * TENSORS_PER_SHARD
