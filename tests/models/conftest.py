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


@pytest.fixture(scope="session")
def h3_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real-architecture `tiny` profile written with seed 0 (1 MiB shards: several for the text encoder)."""
    from models.h3synth import synth_h3
    from models.profiles import get_profile

    path = tmp_path_factory.mktemp("h3") / "tiny"
    synth_h3(path, get_profile("tiny"), seed=0)
    return path
