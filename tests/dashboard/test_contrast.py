"""Text on the theme's primary colour reads at WCAG AA (4.5:1) in both themes, computed from the
colours .streamlit/config.toml sets and the white Streamlit writes on them (buttons, multiselect tags)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHITE = "#ffffff"
DARK_BACKGROUND = "#0e1117"
"""Streamlit's dark theme background, where a focus ring in the primary colour must show (3:1 for UI parts)."""


def luminance(color: str) -> float:
    """WCAG relative luminance of `#rrggbb`."""
    channels = [int(color.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    low, high = sorted((luminance(a), luminance(b)))
    return (high + 0.05) / (low + 0.05)


def test_the_contrast_formula_matches_wcags_reference_values():
    assert contrast("#000000", "#ffffff") == pytest.approx(21.0)
    assert contrast("#56B4E9", WHITE) == pytest.approx(2.31, abs=0.01)  # the dark primary the issue measured


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_white_text_on_the_primary_colour_reads_at_aa(theme):
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    primary = config["theme"][theme]["primaryColor"]
    assert contrast(primary, WHITE) >= 4.5, f"{theme}: white on {primary} is {contrast(primary, WHITE):.2f}:1"
    if theme == "dark":
        assert contrast(primary, DARK_BACKGROUND) >= 3.0
