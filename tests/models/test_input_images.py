"""Input images are checked with Pillow: format, file size, pixel count (before decoding), completeness."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from models.inputs import images as inputs
from models.inputs.images import InputImageError, check_image, open_image


def _save(path: Path, fmt: str, size=(40, 24)) -> Path:
    Image.new("RGB", size, (200, 10, 10)).save(path, fmt)
    return path


@pytest.mark.parametrize("fmt, suffix", [("PNG", ".png"), ("JPEG", ".jpg"), ("WEBP", ".webp")])
def test_png_jpeg_and_webp_are_accepted(tmp_path: Path, fmt: str, suffix: str):
    path = _save(tmp_path / f"a{suffix}", fmt)
    assert check_image(path) == (fmt, (40, 24))
    assert open_image(path).mode == "RGB"


def _bomb(path: Path, width: int, height: int) -> Path:
    """A PNG whose header declares width x height pixels, with a few bytes of data."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
                     + chunk(b"IEND", b""))
    return path


def test_bad_files_get_one_line_naming_the_file(tmp_path: Path, monkeypatch):
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    whole = _save(tmp_path / "whole.png", "PNG", (256, 256))
    cut = tmp_path / "cut.png"
    cut.write_bytes(whole.read_bytes()[: len(whole.read_bytes()) // 2])
    gif = tmp_path / "a.gif"
    Image.new("RGB", (8, 8)).save(gif, "GIF")
    cases = {
        text: "not a readable image",
        cut: "truncated or corrupt",
        gif: "a GIF image; expected PNG, JPEG, WEBP",
        _bomb(tmp_path / "bomb.png", 100_000, 100_000): "a decompression bomb",
        _bomb(tmp_path / "huge.png", 10_000, 5_000): "10000x5000 is 50,000,000 pixels; at most 40,000,000",
        tmp_path / "missing.png": "cannot read",
    }
    for path, message in cases.items():
        with pytest.raises(InputImageError) as caught:
            check_image(path)
        assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
        assert "\n" not in str(caught.value)
    monkeypatch.setattr(inputs, "MAX_IMAGE_BYTES", 100)
    with pytest.raises(InputImageError, match="images up to 0 MiB"):
        check_image(whole)


@pytest.mark.parametrize("size", [(4000, 1), (260, 64), (64, 260), (1, 5)])
def test_an_image_beyond_4_to_1_is_refused_naming_its_size(tmp_path: Path, size):
    path = _save(tmp_path / "wide.png", "PNG", size)
    with pytest.raises(InputImageError) as caught:
        check_image(path)
    assert str(caught.value) == f"{path}: {size[0]}x{size[1]}; MiniMax H3 takes images within 1:4 and 4:1"


@pytest.mark.parametrize("size", [(256, 64), (64, 256), (1, 1)])
def test_an_image_at_exactly_4_to_1_is_accepted(tmp_path: Path, size):
    assert check_image(_save(tmp_path / "edge.png", "PNG", size)) == ("PNG", size)
