"""A Hugging Face cache snapshot of the tiny H3 generates, with no root given, the frames its folder does."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from models.run.pipeline import run_generate
from tests.hub_layout import hub_snapshot
from tests.models.test_pipeline import SMALL, UNIFIED


@pytest.mark.slow
def test_a_hub_snapshot_generates_the_frames_of_the_same_folder(h3_tiny: Path, tmp_path: Path):
    snapshot = hub_snapshot(h3_tiny, tmp_path / "hub")
    params = replace(SMALL, steps=2, audio=False)
    from_folder = run_generate(h3_tiny, params, tmp_path / "a.mp4", device_info=UNIFIED)
    from_snapshot = run_generate(snapshot, params, tmp_path / "b.mp4", device_info=UNIFIED)  # roots: the snapshot
    assert from_snapshot.frames_sha256 == from_folder.frames_sha256
    assert from_snapshot.loads["transformer"]["tensors_placed"] == from_folder.loads["transformer"]["tensors_placed"]
    from models.video.settings import read_video_settings

    carried = read_video_settings(tmp_path / "b.mp4")  # the settings travel with the video
    assert carried["generate"]["prompt"] == params.prompt and carried["generate"]["seed"] == params.seed
    assert carried["model"] == {"name": snapshot.parent.parent.name, "revision": snapshot.name}
    assert read_video_settings(tmp_path / "a.mp4")["model"] == {"name": h3_tiny.name, "revision": None}
