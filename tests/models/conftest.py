"""Fixtures: random-weight MiniMax H3 checkpoints (the tiny and the demo profiles), each written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def h3_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real-architecture `tiny` profile written with seed 0 (1 MiB shards: several for the text encoder)."""
    from models.synth.writer import synth_h3
    from models.synth.profiles import get_profile

    path = tmp_path_factory.mktemp("h3") / "tiny"
    synth_h3(path, get_profile("tiny"), seed=0)
    return path


@pytest.fixture(scope="session")
def h3_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `demo` profile (138 MiB: large enough that its weights, not the process, carry a stage)."""
    from models.synth.writer import synth_h3
    from models.synth.profiles import get_profile

    path = tmp_path_factory.mktemp("h3") / "demo"
    synth_h3(path, get_profile("demo"), seed=0)
    return path
