"""Input images of the `fl2va` and `ref2va` workflows: checked with Pillow before a job is queued.

A file is accepted when it is a PNG, JPEG or WebP of at most `MAX_IMAGE_BYTES`
on disk and `MAX_IMAGE_PIXELS` decoded, within `MAX_ASPECT`, and decodes completely. The pixel
count is read from the header before any pixel is decoded, so a decompression
bomb (a small file declaring a huge canvas) is refused without being inflated.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from core.errors import DrainboardError

IMAGE_FORMATS = {"PNG": ".png", "JPEG": ".jpg", "WEBP": ".webp"}
"""Pillow format name -> the suffix the job's copy gets."""
MAX_IMAGE_BYTES = 32 * 2**20
"""Largest image file accepted (32 MiB)."""
MAX_IMAGE_PIXELS = 40_000_000
"""Most pixels accepted (40 MP: an 8K frame is 33 MP)."""
MAX_ASPECT = 4
"""Widest aspect accepted, either way (4:1 or 1:4): diffusers' H3 canvas rule (`resolve_canvas_size`) refuses a
reference image or a first frame beyond it, and a last frame beyond it is cover-cropped out of a resize as tall as
the canvas (a 4000x1 frame on a 768-high canvas: 3,072,000 px wide)."""


class InputImageError(DrainboardError):
    """An input image cannot be used."""


def require_input_file(path: Path, limit: int, what: str, error: type[Exception]) -> int:
    """The size of the regular file at `path`, or `error` naming it: unreadable, not a file, over `limit` bytes
    (`what`: the plural the message names, e.g. "images")."""
    try:
        size = path.stat().st_size
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror or e}") from None
    if not path.is_file():
        raise error(f"{path}: not a file")
    if size > limit:
        raise error(f"{path}: {size:,} bytes; {what} up to {limit // 2**20} MiB are accepted")
    return size


def check_image(path: str | os.PathLike) -> tuple[str, tuple[int, int]]:
    """(Pillow format, (width, height)) of the image at `path`; InputImageError naming the file otherwise."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    require_input_file(path, MAX_IMAGE_BYTES, "images", InputImageError)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                kind, dims = image.format, image.size
                if kind not in IMAGE_FORMATS:
                    raise InputImageError(f"{path}: a {kind} image; expected {', '.join(IMAGE_FORMATS)}")
                if dims[0] * dims[1] > MAX_IMAGE_PIXELS:
                    raise InputImageError(f"{path}: {dims[0]}x{dims[1]} is {dims[0] * dims[1]:,} pixels; at most"
                                          f" {MAX_IMAGE_PIXELS:,} are accepted")
                image.load()
    except InputImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InputImageError(f"{path}: a decompression bomb (its header declares more pixels than Pillow's limit);"
                              f" at most {MAX_IMAGE_PIXELS:,} pixels are accepted") from None
    except UnidentifiedImageError as e:
        raise InputImageError(f"{path}: not a readable image: {e}") from None
    except (OSError, SyntaxError, ValueError) as e:  # Pillow reports truncated or corrupt data with these
        raise InputImageError(f"{path}: truncated or corrupt image: {e}") from None
    if dims[0] < 1 or dims[1] < 1:
        raise InputImageError(f"{path}: has no pixels")
    if dims[0] > MAX_ASPECT * dims[1] or dims[1] > MAX_ASPECT * dims[0]:
        raise InputImageError(f"{path}: {dims[0]}x{dims[1]}; MiniMax H3 takes images within 1:{MAX_ASPECT} and"
                              f" {MAX_ASPECT}:1")
    return kind, dims


def open_image(path: str | os.PathLike):
    """The checked image at `path` as an RGB PIL image, as diffusers' `load_image` gives it."""
    from PIL import Image, ImageOps

    check_image(path)
    with Image.open(path) as image:
        return ImageOps.exif_transpose(image).convert("RGB")
