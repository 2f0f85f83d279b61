"""Reference clips of the `ref2va` workflow: checked with PyAV before a job is queued, decoded by diffusers.

diffusers' `ref2va` takes a reference video (`MiniMaxH3VideoReference`: frames,
their rate and the soundtrack), decoded from a file by its own
`MiniMaxH3VideoReference.from_file` through PyAV; `open_clip` hands exactly
that to the pipeline. `check_clip` refuses, naming the file, what that decode
or the blocks after it would fail on or could not hold: not an MP4/MOV, no
video stream, a file over `MAX_CLIP_BYTES`, frames over `MAX_CLIP_PIXELS`, a
clip over `MAX_CLIP_SECONDS` or whose decoded frames (which diffusers holds all
at once, as RGB) pass `MAX_CLIP_DECODED_BYTES` (read from the header first,
then counted while decoding, so nothing large is held), a truncated or corrupt
stream, fewer frames than the conditioner reads (`MIN_CLIP_FRAMES` at 24 fps),
and a soundtrack diffusers cannot take (more than two channels, or a rate
other than the audio VAE's where torchaudio, which resamples it, is missing),
should not take (NaN or infinite samples) or whose decode it would hold
unbounded (over `MAX_SOUNDTRACK_SECONDS`, as declared, then as counted while
decoding, or at a rate over `MAX_SOUNDTRACK_RATE`). Video frames decode to
8-bit RGB, finite by construction; a soundtrack decodes to float samples,
which can hold NaN.
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from core.errors import DrainboardError

from .images import require_input_file
from ..request.video_length import FPS, MAX_SECONDS

CLIP_SUFFIX = ".mp4"
"""The suffix a job's copy of a clip gets (MP4 and MOV share the ISO container; PyAV reads either by content)."""
CLIP_FORMATS = ("mp4", "mov")
"""PyAV demuxer names accepted (its `mov,mp4,m4a,3gp,3g2,mj2` demuxer)."""
MAX_CLIP_BYTES = 256 * 2**20
"""Largest clip file accepted (256 MiB)."""
MAX_CLIP_SECONDS = 60.0
"""Longest clip accepted; diffusers keeps only as many frames as the request generates (at most 15 s)."""
MAX_SOUNDTRACK_SECONDS = MAX_CLIP_SECONDS
"""Longest soundtrack accepted, as long as the longest clip: diffusers decodes all of it as float32 (twice over while
it joins the pieces) and then keeps only as much as the request generates (at most `MAX_SECONDS`)."""
MAX_SOUNDTRACK_RATE = 192_000
"""Highest soundtrack rate accepted (studio masters'): with `MAX_SOUNDTRACK_SECONDS`, it bounds what the decode
holds (92 MB of stereo float32), which a losslessly compressed track of silence at a made-up rate would not."""
READ_CLIP = "read_clip"
"""The run's stage in which diffusers decodes the clip (its frames and its whole soundtrack, before any weight)."""
MAX_CLIP_PIXELS = 3840 * 2160
"""Most pixels per frame accepted (4K UHD)."""
MAX_CLIP_DECODED_BYTES = 2 * 2**30
"""Most decoded RGB bytes accepted: diffusers' `from_file` holds every frame at once before it truncates."""
MIN_CLIP_FRAMES = 13
"""Frames a clip must run at 24 fps: the conditioner reads it at 2 fps (every 12th frame) and merges the frames it
reads in pairs (Qwen3-VL's temporal patch), so it needs frames 0 and 12 (diffusers raises otherwise)."""


class InputClipError(DrainboardError):
    """A reference clip cannot be used."""


@dataclass(frozen=True)
class ClipInfo:
    """What `check_clip` read from a clip."""

    frames: int
    """Video frames decoded."""
    fps: float
    """The frame rate the container reports (what diffusers resamples from)."""
    width: int
    """Pixels, upright (the stream's rotation applied, as diffusers applies it)."""
    height: int
    """Pixels, upright."""
    audio_rate: int | None
    """The soundtrack's sample rate; None without an audio stream."""
    audio_channels: int | None = None
    """The soundtrack's channels (1 or 2 once checked); None without an audio stream."""
    audio_seconds: float | None = None
    """The soundtrack's length as its stream declares it; None without one, or where the file does not say."""

    @property
    def frames_at_24(self) -> int:
        """Frames after diffusers' resample onto 24 fps."""
        return frames_at_24(self.frames, self.fps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def frames_at_24(frames: int, fps: float) -> int:
    """How many frames `frames` at `fps` become on diffusers' 24 fps grid (whole frames dropped or held)."""
    return frames if fps == FPS else math.floor(frames * FPS / fps + 0.5)


def check_clip(path: str | os.PathLike, sampling_rate: int | None = None) -> ClipInfo:
    """What the clip at `path` holds; InputClipError naming the file when diffusers could not use it.

    `sampling_rate`: the audio VAE's; a soundtrack at another rate needs torchaudio (None: not checked).
    """
    import av

    path = Path(path)
    require_input_file(path, MAX_CLIP_BYTES, "clips", InputClipError)
    try:
        container = av.open(str(path))
    except (av.FFmpegError, UnicodeDecodeError, ValueError) as e:
        raise InputClipError(f"{path}: not a readable video: {e}") from None
    with container:
        kind = container.format.name
        if not set(kind.split(",")) & set(CLIP_FORMATS):
            raise InputClipError(f"{path}: a {container.format.long_name or kind} file; expected MP4 or MOV")
        if not container.streams.video:
            raise InputClipError(f"{path}: has no video stream")
        info = _check_video(path, container, container.streams.video[0])
        if container.streams.audio:
            container.seek(0)
            info = replace(info, **_check_audio(path, container, container.streams.audio[0], sampling_rate))
    if info.frames_at_24 < MIN_CLIP_FRAMES:
        resampled = "" if info.fps == FPS else f" ({info.frames_at_24} at {FPS} fps)"
        raise InputClipError(f"{path}: {info.frames} frames at {info.fps:g} fps{resampled}; a reference clip needs at"
                             f" least {MIN_CLIP_FRAMES} at {FPS} fps ({MIN_CLIP_FRAMES / FPS:.2f} s)")
    return info


def _check_video(path: Path, container, stream) -> ClipInfo:
    import av

    width, height = stream.codec_context.width, stream.codec_context.height
    if width * height > MAX_CLIP_PIXELS:
        raise InputClipError(f"{path}: {width}x{height} frames are {width * height:,} pixels; at most"
                             f" {MAX_CLIP_PIXELS:,} are accepted")
    fps = float(stream.average_rate or stream.guessed_rate or 0)
    if fps <= 0:
        raise InputClipError(f"{path}: the video stream reports no frame rate")
    most = min(int(MAX_CLIP_SECONDS * fps), MAX_CLIP_DECODED_BYTES // max(1, width * height * 3))
    declared = int(stream.frames or 0)
    if declared > most:
        raise InputClipError(_too_long(path, declared, fps, width, height))
    frames, rotation = 0, 0.0
    try:
        for frame in container.decode(stream):
            frames += 1
            rotation = frame.rotation
            if frames > most:
                raise InputClipError(_too_long(path, frames, fps, width, height, at_least=True))
    except av.FFmpegError as e:
        raise InputClipError(f"{path}: truncated or corrupt video after {frames} frames: {e}") from None
    if frames == 0:
        raise InputClipError(f"{path}: no video frame decodes")
    if declared and frames < declared:
        raise InputClipError(f"{path}: truncated video: {frames} of the {declared} frames its header declares decode")
    if round(rotation / 90.0) % 2:
        width, height = height, width
    return ClipInfo(frames=frames, fps=fps, width=width, height=height, audio_rate=None)


def _too_long(path: Path, frames: int, fps: float, width: int, height: int, at_least: bool = False) -> str:
    more = "at least " if at_least else ""
    return (f"{path}: {more}{frames} frames at {fps:g} fps ({frames / fps:.1f} s, {frames * width * height * 3:,} bytes"
            f" decoded); clips up to {MAX_CLIP_SECONDS:g} s and {MAX_CLIP_DECODED_BYTES // 2**30} GiB decoded are accepted")


def _soundtrack(stream) -> dict[str, Any]:
    """What an audio stream declares: its `ClipInfo` fields."""
    seconds = float(stream.duration * stream.time_base) if stream.duration and stream.time_base else None
    return {"audio_rate": int(stream.codec_context.sample_rate), "audio_channels": int(stream.codec_context.channels),
            "audio_seconds": seconds}


def _check_audio(path: Path, container, stream, sampling_rate: int | None) -> dict[str, Any]:
    """The soundtrack's `ClipInfo` fields, once it decodes whole, finite and within `MAX_SOUNDTRACK_SECONDS`."""
    import av
    import numpy as np

    declared = _soundtrack(stream)
    rate, channels, seconds = declared["audio_rate"], declared["audio_channels"], declared["audio_seconds"]
    if channels not in (1, 2):
        raise InputClipError(f"{path}: its soundtrack has {channels} channels; diffusers takes mono or stereo")
    if not 0 < rate <= MAX_SOUNDTRACK_RATE:
        raise InputClipError(f"{path}: its soundtrack is at {rate:,} Hz; rates from 1 to {MAX_SOUNDTRACK_RATE:,} Hz are"
                             " accepted")
    if seconds is not None and seconds > MAX_SOUNDTRACK_SECONDS:
        raise InputClipError(_soundtrack_too_long(path, seconds))
    if sampling_rate is not None and rate != sampling_rate and importlib.util.find_spec("torchaudio") is None:
        raise InputClipError(f"{path}: its soundtrack is at {rate} Hz; diffusers resamples it to the audio VAE's"
                             f" {sampling_rate} Hz with torchaudio, which is not installed (give a clip at"
                             f" {sampling_rate} Hz, or one without sound)")
    most, samples = int(MAX_SOUNDTRACK_SECONDS * rate), 0
    try:
        for frame in container.decode(stream):
            if frame.format.name in _FLOAT_SAMPLES and not np.isfinite(frame.to_ndarray()).all():
                raise InputClipError(f"{path}: its soundtrack holds NaN or infinite samples (from {samples / rate:.2f}"
                                     " s on); the video generated from it would come out black and silent")
            samples += frame.samples
            if samples > most:
                raise InputClipError(_soundtrack_too_long(path, samples / rate, at_least=True))
    except av.FFmpegError as e:
        raise InputClipError(f"{path}: truncated or corrupt soundtrack: {e}") from None
    return declared


_FLOAT_SAMPLES = frozenset({"flt", "fltp", "dbl", "dblp"})
"""FFmpeg's floating-point sample formats: the only ones that can hold NaN or infinity."""


def _soundtrack_too_long(path: Path, seconds: float, at_least: bool = False) -> str:
    more = "at least " if at_least else ""
    return (f"{path}: its soundtrack runs {more}{seconds:.1f} s; soundtracks up to {MAX_SOUNDTRACK_SECONDS:g} s are"
            f" accepted (diffusers conditions on at most the {MAX_SECONDS:g} s a video generates)")


def read_clip_header(path: str | os.PathLike) -> ClipInfo | None:
    """What a clip's header says, for the forecast: the frames it declares (else its duration at its rate), the
    rate, the upright size (one frame decoded, for its rotation) and the soundtrack's rate, channels and length;
    None where PyAV cannot read it (`check_clip` refuses such a clip at submit, naming the file). Decodes one
    frame, not the clip."""
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                return None
            stream = container.streams.video[0]
            fps = float(stream.average_rate or stream.guessed_rate or 0)
            seconds = float(stream.duration * stream.time_base) if stream.duration and stream.time_base else 0.0
            frames = int(stream.frames or 0) or round(seconds * fps)
            width, height = stream.codec_context.width, stream.codec_context.height
            rotation = next(iter(container.decode(stream)), None)
            if rotation is not None and round(rotation.rotation / 90.0) % 2:
                width, height = height, width
            audio = container.streams.audio
            soundtrack = _soundtrack(audio[0]) if audio else {}
    except (av.FFmpegError, OSError, UnicodeDecodeError, ValueError):
        return None
    if fps <= 0 or frames <= 0:
        return None
    return ClipInfo(frames=frames, fps=fps, width=width, height=height, **{"audio_rate": None, **soundtrack})


def open_clip(path: str | os.PathLike):
    """The checked clip at `path` as diffusers' own `MiniMaxH3VideoReference.from_file` decodes it (frames, rate and
    soundtrack), which is what diffusers' `ref2va` is handed for a clip."""
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3VideoReference

    check_clip(path)
    return MiniMaxH3VideoReference.from_file(str(path))
