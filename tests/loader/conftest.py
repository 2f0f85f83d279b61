"""Loader fixtures: a tiny checkpoint in the real MiniMax H3 layout (see h3_layout)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .h3_layout import write_h3_layout


@pytest.fixture(scope="session")
def h3_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Read-only: tests that modify a layout copy it first."""
    return write_h3_layout(tmp_path_factory.mktemp("h3") / "MiniMax-H3")
