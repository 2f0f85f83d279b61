"""Fixtures: a tiny synthetic model folder written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from models import get_profile, synth_checkpoint


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `tiny` profile written with seed 0 in small shards (several per component where it is big enough)."""
    path = tmp_path_factory.mktemp("models") / "tiny"
    synth_checkpoint(path, get_profile("tiny"), shard_bytes=100_000, seed=0)
    return path
