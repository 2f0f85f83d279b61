"""A generate's settings travel in its MP4: written into the `comment` tag, read back, refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from models.video.encode import write_mp4
from models.request.params import GenerateParams
from models.video.settings import VideoSettingsError, read_video_settings, video_settings


def _clip(path: Path, comment: str | None) -> Path:
    write_mp4(path, np.zeros((3, 32, 48, 3), np.uint8), 24, comment=comment)
    return path


def test_the_settings_written_into_an_mp4_come_back_with_inputs_by_name(tmp_path: Path):
    params = GenerateParams(prompt="a fox ✓ \"in snow\"", seed=7, steps=4, frames=141, width=192, height=112,
                            image="/home/someone/pictures/first.png")
    settings = video_settings(params, tmp_path / "hub" / "models--x--h3" / "snapshots" / "abc123",
                              extra={"plan": {"chosen": 2}})
    read = read_video_settings(_clip(tmp_path / "v.mp4", json.dumps(settings)))
    assert read == json.loads(json.dumps(settings))
    assert read["generate"]["image"] == "first.png"  # a path names someone's disk: the name only
    assert read["generate"]["workflow"] == "fl2va" and read["generate"]["seed"] == 7
    assert read["model"] == {"name": "models--x--h3", "revision": "abc123"} and read["plan"] == {"chosen": 2}


def test_a_video_without_settings_reads_none_and_a_broken_one_says_why_in_one_line(tmp_path: Path):
    assert read_video_settings(_clip(tmp_path / "plain.mp4", None)) is None
    assert read_video_settings(_clip(tmp_path / "other.mp4", "made with something else")) is None
    with pytest.raises(VideoSettingsError, match=r"^its settings are damaged"):
        read_video_settings(_clip(tmp_path / "bad.mp4", '{"drainboard_settings": 1, "generate": {'))
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video at all")
    with pytest.raises(VideoSettingsError, match=r"^not a readable video") as e:
        read_video_settings(junk)
    assert "\n" not in str(e.value)
