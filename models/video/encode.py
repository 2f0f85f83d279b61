"""MP4 output that browsers play: H.264 in yuv420p (crf 20), even sizes, faststart, AAC audio (PyAV).

MiniMax H3 gives 24 fps video and a stereo 32 kHz soundtrack; both go in as they come.
"""

from __future__ import annotations

import os
from fractions import Fraction

import av
import numpy as np

from core.diskspace import free_bytes, is_disk_full
from core.errors import DiskFullError

AAC_FRAME = 1024
"""Samples per AAC frame."""
_LAYOUTS = {1: "mono", 2: "stereo"}
"""AAC channel layout by channel count."""


def write_mp4(
    path: str | os.PathLike,
    frames: np.ndarray,
    fps: int,
    audio: np.ndarray | None = None,
    sample_rate: int = 32000,
    *,
    crf: int = 20,
    comment: str | None = None,
) -> None:
    """Encode `frames` (F, H, W, 3) uint8 and optional `audio` (float in [-1, 1]) to `path`, with `comment` in
    the file's `comment` tag (a generate's settings, models.video.settings).

    `audio` is (channels, samples) with 1 or 2 channels (H3's soundtrack is
    stereo), or 1-D for mono; AAC keeps the channel count.

    The file is not bit-reproducible: libx264 output varied between identical
    runs here, so compare the frames' digest (GenerateResult.frames_sha256).

    Odd sizes are cropped by one pixel (yuv420p needs even sizes); the moov
    atom goes first (`movflags=+faststart`) so playback starts before the
    download ends. On any failure the partial file is removed; on a full
    disk a DiskFullError names it.
    """
    try:
        _encode(path, frames, fps, audio, sample_rate, crf, comment)
    except BaseException as e:
        removed = os.path.isfile(path)  # never a device such as /dev/full
        if removed:
            os.unlink(path)
        if isinstance(e, OSError) and is_disk_full(e):
            raise DiskFullError(f"disk full while writing {path}: {free_bytes(path):,} bytes free"
                                + ("; removed the partial file" if removed else "")) from e
        raise


def silence_non_finite(audio: np.ndarray) -> tuple[np.ndarray, int]:
    """`audio` with each NaN or infinite sample set to 0, and how many there were. AAC refuses them (FFmpeg's
    encoder fails the frame with EINVAL), and a model whose audio diverged should still give its video."""
    bad = ~np.isfinite(audio)
    count = int(bad.sum())
    return (np.where(bad, 0.0, audio).astype(audio.dtype, copy=False) if count else audio), count


def _encode(path: str | os.PathLike, frames: np.ndarray, fps: int, audio: np.ndarray | None, sample_rate: int,
            crf: int, comment: str | None) -> None:
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be (F, H, W, 3) uint8, got {frames.shape} {frames.dtype}")
    height, width = frames.shape[1] // 2 * 2, frames.shape[2] // 2 * 2
    frames = frames[:, :height, :width]
    with av.open(str(path), mode="w", format="mp4", options={"movflags": "+faststart"}) as container:
        if comment:
            container.metadata["comment"] = comment
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.options = {"crf": str(crf), "preset": "veryfast"}
        sound = None
        if audio is not None:
            samples = np.atleast_2d(audio).astype(np.float32)
            if not np.isfinite(samples).all():
                raise ValueError(f"{path}: audio has {int((~np.isfinite(samples)).sum())} NaN or infinite samples, "
                                 "which AAC cannot encode (models.video.encode.silence_non_finite sets them to silence)")
            samples = np.clip(samples, -1.0, 1.0)
            if samples.shape[0] not in _LAYOUTS:
                raise ValueError(f"audio must be (channels, samples) with 1 or 2 channels, got {audio.shape}")
            layout = _LAYOUTS[samples.shape[0]]
            sound = container.add_stream("aac", rate=sample_rate)
            sound.layout = layout
        for i, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            container.mux(video.encode(frame))
        container.mux(video.encode())
        if sound is not None:
            for start in range(0, samples.shape[1], AAC_FRAME):
                piece = np.ascontiguousarray(samples[:, start : start + AAC_FRAME])
                frame = av.AudioFrame.from_ndarray(piece, format="fltp", layout=layout)
                frame.sample_rate = sample_rate
                frame.pts = start
                frame.time_base = Fraction(1, sample_rate)
                container.mux(sound.encode(frame))
            container.mux(sound.encode())
