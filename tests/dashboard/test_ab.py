"""Compare's A/B on known videos: PSNR and SSIM per frame, the worst frame and its difference, the cost deltas, and
the page drawing them for two jobs of one request."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dashboard.views.ab import cost_deltas, frame_diff, read_frames, request_mismatch
from dashboard.views.cards import seconds_per_step
from models.video.encode import write_mp4
from tests.dashboard.test_pages import page


def _clip(frames: int = 6, size: int = 64) -> np.ndarray:
    """A smooth moving gradient: what a codec keeps well, so an edit stands out."""
    y, x = np.mgrid[0:size, 0:size]
    return np.stack([np.stack([(x * 3 + t * 8) % 256, (y * 3) % 256, ((x + y) * 2) % 256], -1)
                     for t in range(frames)]).astype(np.uint8)


def test_psnr_and_ssim_per_frame_match_their_definitions_on_known_arrays():
    a = _clip()
    b = a.copy()
    b[2] = np.clip(a[2].astype(int) + 10, 0, 255).astype(np.uint8)  # +10 everywhere the gradient allows
    b[4, :8, :8] = 255 - a[4, :8, :8]  # a block inverted: the structure breaks
    diff = frame_diff(a, b)
    assert diff.psnr[0] == math.inf and diff.ssim[0] == pytest.approx(1.0)
    mse = np.mean((a[2].astype(float) - b[2].astype(float)) ** 2)
    assert diff.psnr[2] == pytest.approx(10 * math.log10(255**2 / mse))
    assert diff.ssim[4] < diff.ssim[2] < 1.0 and diff.worst == 4
    assert diff.difference_max == int(np.abs(a[4].astype(int) - b[4].astype(int)).max())
    assert diff.difference.dtype == np.uint8 and diff.difference.max() == 255 and diff.difference[20:, 20:].max() == 0
    with pytest.raises(ValueError, match="differ in shape"):
        frame_diff(a, b[:3])


def test_two_mp4s_written_by_the_project_s_writer_are_read_back_and_the_edited_frame_is_the_worst(tmp_path):
    a = _clip(frames=8)
    b = a.copy()
    b[5, 16:48, 16:48] = 0  # a black square in frame 5
    write_mp4(tmp_path / "a.mp4", a, 24)
    write_mp4(tmp_path / "b.mp4", b, 24)
    fa, fb = read_frames(tmp_path / "a.mp4"), read_frames(tmp_path / "b.mp4")
    assert fa.shape == a.shape and fa.dtype == np.uint8
    diff = frame_diff(fa, fb)
    assert diff.worst == 5 and diff.ssim[5] < 0.8
    assert min(diff.ssim[:5]) > 0.95 and min(p for p in diff.psnr[:5]) > 35  # untouched frames: codec noise only


def test_jobs_of_another_request_are_named_and_costs_are_compared_compile_left_out_of_s_per_step():
    from models.speed.levers import COMPILE_CALLS

    # B's 7 DiT calls: the compiling ones timed as denoise.compile, the rest 1 s each.
    a = {"spec": {"generate": {"prompt": "fox", "seed": 1, "steps": 8}}, "started_at": 100.0, "finished_at": 160.0,
         "progress_done": 7,
         "metrics": {"peak_footprint": 4 * 2**30, "steps": 7, "stage_seconds": {"denoise.denoise": 14.0}}}
    b = {"spec": {"generate": {"prompt": "fox", "seed": 1, "steps": 8, "compile": True}}, "started_at": 0.0,
         "progress_done": 7,
         "finished_at": 30.0, "metrics": {"peak_footprint": 5 * 2**30, "steps": 7,
                                          "stage_seconds": {"denoise.denoise": 1.0 * (7 - COMPILE_CALLS),
                                                            "denoise.compile": 20.0}}}
    assert request_mismatch(a, b) == []
    assert request_mismatch(a, {**b, "spec": {"generate": {"prompt": "fox", "seed": 2, "steps": 8}}}) == ["seed"]
    assert seconds_per_step(a, None, 0.0) == 2.0 and seconds_per_step(b, None, 0.0) == 1.0
    rows = {r["cost"]: r for r in cost_deltas(a, b)}
    assert rows["s/step"]["B / A"] == "0.50x" and rows["s/step"]["B - A"] == "-1.000 s"
    assert rows["total time"]["B / A"] == "0.50x" and rows["peak memory"]["B / A"] == "1.25x"


def test_compare_draws_the_a_b_of_two_generate_jobs_of_one_request(fresh_db, job_adder, load_samples, data_dir):
    from storage.artifacts import job_dir, record_artifact

    db = fresh_db
    clip = _clip(frames=6)
    edited = clip.copy()
    edited[3, :32] = 0
    ids = []
    for frames, extra in ((clip, {}), (edited, {"step_cache": "taylorseer"})):
        job_id = job_adder(db, status="succeeded", kind="generate", samples=load_samples,
                           generate={"prompt": "a fox", "seed": 3, **extra},
                           metrics={"peak_footprint": 2**30, "steps": 2, "stage_seconds": {"denoise.denoise": 1.0}})
        folder = job_dir(data_dir, job_id)
        folder.mkdir(parents=True)
        write_mp4(folder / "video.mp4", frames, 24)
        record_artifact(db, data_dir, job_id, folder / "video.mp4")
        ids.append(job_id)
    at = page("compare")
    at.query_params["jobs"] = ",".join(map(str, ids))
    at.run()
    assert not at.exception, at.exception
    assert any(s.value == "A/B: frames and costs" for s in at.subheader)
    assert any(c.value.startswith("Worst frame: 3 (SSIM") for c in at.caption)
    assert [c for image in at.get("image") for c in image.captions][0].startswith("|A - B| at frame 3, white = ")
    costs = next(d.value for d in at.dataframe if "B / A" in d.value.columns)
    assert list(costs["cost"]) == ["peak memory", "s/step", "total time"]
