"""Reference clips are checked with PyAV before a job is queued: container, size, length, completeness, soundtrack."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from models.inputs import clips
from models.inputs.clips import ClipInfo, InputClipError, check_clip
from models.video.encode import write_mp4


def _clip(path: Path, frames: int = 20, fps: int = 25, rate: int | None = 32000) -> Path:
    rng = np.random.RandomState(frames)
    wave = None if rate is None else (rng.rand(2, rate).astype(np.float32) - 0.5) * 0.2
    write_mp4(path, (rng.rand(frames, 48, 80, 3) * 255).astype(np.uint8), fps, wave, rate or 32000)
    return path


def test_an_mp4_is_read_with_its_rate_size_and_soundtrack(tmp_path: Path):
    assert check_clip(_clip(tmp_path / "a.mp4"), 32000) == ClipInfo(20, 25.0, 80, 48, 32000, 2, 1.0)
    silent = check_clip(_clip(tmp_path / "b.mp4", frames=13, fps=24, rate=None), 32000)
    assert (silent.frames, silent.frames_at_24, silent.audio_rate) == (13, 13, None)


def test_bad_clips_get_one_line_naming_the_file(tmp_path: Path, monkeypatch):
    whole = _clip(tmp_path / "whole.mp4")
    body = whole.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(body[: len(body) // 2])
    text = tmp_path / "notes.mp4"
    text.write_text("not a video")
    png = tmp_path / "still.png"
    Image.new("RGB", (8, 8)).save(png)
    cases = {
        text: "not a readable video",
        cut: "truncated",
        png: "expected MP4 or MOV",
        _clip(tmp_path / "short.mp4", frames=12, fps=24): "12 frames at 24 fps; a reference clip needs at least 13",
        _clip(tmp_path / "slow.mp4", frames=6, fps=12): "6 frames at 12 fps (12 at 24 fps); a reference clip needs",
        _clip(tmp_path / "cd.mp4", rate=44100): "at 44100 Hz; diffusers resamples it to the audio VAE's 32000 Hz",
        tmp_path / "missing.mp4": "cannot read",
    }
    for path, message in cases.items():
        with pytest.raises(InputClipError) as caught:
            check_clip(path, 32000)
        assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value), str(caught.value)
        assert "\n" not in str(caught.value)
    assert check_clip(tmp_path / "cd.mp4").audio_rate == 44100  # the rate is only checked against a model's
    assert check_clip(_clip(tmp_path / "slow7.mp4", frames=7, fps=12)).frames_at_24 == 14  # held frames count
    monkeypatch.setattr(clips, "MAX_CLIP_SECONDS", 0.5)
    with pytest.raises(InputClipError, match=r"20 frames at 25 fps \(0.8 s.*up to 0.5 s"):
        check_clip(whole)
    monkeypatch.setattr(clips, "MAX_CLIP_SECONDS", 60.0)
    monkeypatch.setattr(clips, "MAX_CLIP_DECODED_BYTES", 10 * 80 * 48 * 3)
    with pytest.raises(InputClipError, match="20 frames at 25 fps"):
        check_clip(whole)
    monkeypatch.setattr(clips, "MAX_CLIP_BYTES", 100)
    with pytest.raises(InputClipError, match="clips up to 0 MiB"):
        check_clip(whole)


def test_the_forecast_s_header_read_agrees_with_the_full_check_and_reads_nothing_bad(tmp_path: Path):
    from models.inputs.clips import read_clip_header

    clip = _clip(tmp_path / "a.mp4")
    assert read_clip_header(clip) == check_clip(clip, 32000)
    assert read_clip_header(_clip(tmp_path / "silent.mp4", rate=None)).audio_rate is None
    text = tmp_path / "notes.mp4"
    text.write_text("not a video")
    assert read_clip_header(text) is None and read_clip_header(tmp_path / "missing.mp4") is None


def float_soundtrack_clip(path: Path, seconds: float, value: float = 0.1, rate: int = 32000, channels: int = 2) -> Path:
    """A MOV of 20 frames at 24 fps with a float32 PCM soundtrack of `seconds` (AAC cannot carry NaN; PCM can)."""
    from fractions import Fraction

    import av

    layout = {1: "mono", 2: "stereo"}[channels]
    with av.open(str(path), "w", format="mov") as container:
        video = container.add_stream("libx264", rate=24)
        video.width, video.height, video.pix_fmt = 80, 48, "yuv420p"
        sound = container.add_stream("pcm_f32le", rate=rate)
        sound.layout = layout
        for i in range(20):
            frame = av.VideoFrame.from_ndarray(np.zeros((48, 80, 3), np.uint8), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, 24)
            container.mux(video.encode(frame))
        container.mux(video.encode())
        total = int(seconds * rate)
        for start in range(0, total, 4096):
            piece = np.full((1, channels * min(4096, total - start)), value, np.float32)
            frame = av.AudioFrame.from_ndarray(piece, format="flt", layout=layout)
            frame.sample_rate, frame.pts, frame.time_base = rate, start, Fraction(1, rate)
            container.mux(sound.encode(frame))
        container.mux(sound.encode())
    return path


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_soundtrack_that_is_not_finite_is_refused_in_one_line(tmp_path: Path, value: float):
    path = float_soundtrack_clip(tmp_path / "nan.mov", 1.0, value)
    with pytest.raises(InputClipError) as caught:
        check_clip(path, 32000)
    assert str(caught.value) == (f"{path}: its soundtrack holds NaN or infinite samples (from 0.00 s on); the video"
                                 " generated from it would come out black and silent")
    assert check_clip(float_soundtrack_clip(tmp_path / "fine.mov", 1.0), 32000).audio_seconds == 1.0


def test_a_soundtrack_over_the_bound_is_refused_as_declared_and_as_counted(tmp_path: Path, monkeypatch):
    long = float_soundtrack_clip(tmp_path / "long.mov", 61.0, rate=8000, channels=1)
    with pytest.raises(InputClipError) as caught:
        check_clip(long)
    assert str(caught.value) == (f"{long}: its soundtrack runs 61.0 s; soundtracks up to 60 s are accepted"
                                 " (diffusers conditions on at most the 15 s a video generates)")
    fast = float_soundtrack_clip(tmp_path / "fast.mov", 0.01, rate=384000, channels=1)
    with pytest.raises(InputClipError, match=r"fast.mov: its soundtrack is at 384,000 Hz; rates from 1 to 192,000 Hz"):
        check_clip(fast)
    info = check_clip(float_soundtrack_clip(tmp_path / "short.mov", 2.0, rate=8000, channels=1))
    assert (info.audio_rate, info.audio_channels, info.audio_seconds) == (8000, 1, 2.0)
    # A header that declares no length (or a false one) is held to the bound by counting the decoded samples.
    declared = clips._soundtrack
    monkeypatch.setattr(clips, "_soundtrack", lambda stream: {**declared(stream), "audio_seconds": None})
    with pytest.raises(InputClipError, match=r"its soundtrack runs at least 60\.\d s; soundtracks up to 60 s"):
        check_clip(long)
