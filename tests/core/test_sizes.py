"""The one size grammar every size option and setting reads (`core.sizes`)."""

import subprocess
import sys
from pathlib import Path

import pytest

from core.sizes import MAX_SIZE, SizeError, format_size, parse_size


@pytest.mark.parametrize("text, size", [
    ("700MB", 700 * 10**6), ("5GB", 5 * 10**9), ("5G", 5 * 10**9), ("512k", 512_000), ("2TB", 2 * 10**12),
    ("4GiB", 4 * 2**30), ("4gib", 4 * 2**30), ("16Mi", 16 * 2**20), ("1KiB", 1024),
    ("0.5GiB", 2**29), (".5 GiB", 2**29), ("1.5 GB", 1_500_000_000), ("123", 123), ("7B", 7), (2048, 2048),
    ("1.1MiB", 1_153_433), ("0.3KiB", 307), (str(MAX_SIZE), MAX_SIZE),
])
def test_sizes_take_decimal_and_binary_units_exactly(text, size):
    assert parse_size(text) == size


def test_a_decimal_fraction_is_exact_where_a_float_would_round():
    assert parse_size("9007199254740993B") == 9007199254740993  # 2**53 + 1: float() gives ...992
    assert parse_size("1.000000000000000001TB") == 10**12


@pytest.mark.parametrize("text, message", [
    ("1e30", "is not a size"), ("lots", "is not a size"), ("4 XB", "is not a size"), ("", "is not a size"),
    ("1,5GB", "is not a size"), ("-5MB", "is negative"), ("0", "too small; the minimum is 1 byte"),
    (0, "too small"), (str(MAX_SIZE + 1), "too large"), ("10000000000000000000000000000000", "too large"),
    (True, "is not a size"), (1.5, "is not a size"),
])
def test_nonsense_negative_and_out_of_range_sizes_are_refused_saying_why(text, message):
    with pytest.raises(SizeError, match=message):
        parse_size(text)


def test_the_minimum_is_stated_in_the_unit_a_reader_uses():
    with pytest.raises(ValueError, match=r"'0.5' is too small; the minimum is 1.0 MiB \(1,048,576 bytes\)"):
        parse_size("0.5", minimum=2**20)
    assert parse_size("0.5MiB", minimum=2**19) == 2**19


@pytest.mark.parametrize("nbytes, text", [
    (1000, "1,000 bytes"), (2**20, "1.0 MiB"), (700 * 10**6, "667.6 MiB"), (320 * 2**20, "320.0 MiB"),
    (2**30, "1.00 GiB"), (int(37.56 * 2**30), "37.56 GiB"),
])
def test_small_sizes_read_in_mib_not_as_zero_gib(nbytes, text):
    assert format_size(nbytes) == text


def test_the_size_module_itself_imports_no_torch():
    path = Path(__file__).resolve().parents[2] / "core" / "sizes.py"
    code = f"import importlib.util, sys; spec = importlib.util.spec_from_file_location('s', {str(path)!r});" \
           " m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("text", ["５GB", "٣MiB", "1.５GB", "²KB"])
def test_only_ascii_digits_make_a_size(text):
    with pytest.raises(SizeError, match="is not a size"):
        parse_size(text)


def test_a_crafted_size_is_quoted_bounded():
    with pytest.raises(SizeError) as caught:
        parse_size("7" * 30000 + "XB")
    assert len(str(caught.value)) < 400
