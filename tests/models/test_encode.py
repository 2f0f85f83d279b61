"""Audio that is not finite: AAC refuses it (FFmpeg's encoder fails the frame with EINVAL, which surfaced as
"avcodec_send_frame() returned 22" at the end of a random-weight generate), so the encoder names it and the
pipeline writes those samples as silence."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from models.video.encode import silence_non_finite, write_mp4

FRAMES = np.zeros((4, 16, 16, 3), np.uint8)


def _wave() -> np.ndarray:
    wave = np.random.RandomState(0).uniform(-0.5, 0.5, (2, 4000)).astype(np.float32)
    wave[0, 10], wave[1, 3000], wave[1, 3001] = np.nan, np.inf, -np.inf
    return wave


def test_audio_with_nan_or_inf_is_refused_by_name_and_leaves_no_file(tmp_path: Path):
    path = tmp_path / "c.mp4"
    with pytest.raises(ValueError, match=r"c\.mp4: audio has 3 NaN or infinite samples"):
        write_mp4(path, FRAMES, 8, _wave(), 32000)
    assert not path.exists()


def test_non_finite_samples_become_silence_and_the_rest_is_untouched(tmp_path: Path):
    wave = _wave()
    clean, count = silence_non_finite(wave)
    assert count == 3 and np.isfinite(clean).all()
    assert clean[0, 10] == 0 and clean[1, 3000] == 0 and clean[1, 3001] == 0
    kept = np.isfinite(wave)
    assert np.array_equal(clean[kept], wave[kept]) and clean.dtype == wave.dtype
    assert silence_non_finite(clean)[1] == 0
    write_mp4(tmp_path / "c.mp4", FRAMES, 8, clean, 32000)
    with av.open(str(tmp_path / "c.mp4")) as container:
        assert [s.type for s in container.streams] == ["video", "audio"]
