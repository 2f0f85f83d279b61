"""Compare's A/B of two generate jobs of one prompt and seed: how far B's frames are from A's, and what B cost.

This is how a user with real weights judges a lossy lever (or a LoRA): the same
request run with and without it, frame by frame. PSNR and SSIM come from
scikit-image (`skimage.metrics`); frames are read from each job's MP4 with PyAV.
Plain functions of job rows and arrays; the page draws them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from dashboard import format as fmt
from dashboard.views.cards import seconds_per_step

SAME_REQUEST = ("prompt", "seed", "frames", "width", "height", "steps", "workflow")
"""The generate fields two jobs must share for their frames to be compared."""


@dataclass(frozen=True)
class FrameDiff:
    """Per-frame distance of B's video from A's."""

    psnr: list[float]
    """dB per frame (inf where the frames are identical)."""
    ssim: list[float]
    """Structural similarity per frame (1.0 identical)."""
    worst: int
    """The frame furthest from A's: the lowest SSIM (the first of equals)."""
    difference: np.ndarray
    """|A - B| at the worst frame, uint8 RGB, scaled so its largest difference is white."""
    difference_max: int
    """The largest per-channel difference at the worst frame, in 0..255 (what white stands for)."""


def read_frames(path: str | os.PathLike) -> np.ndarray:
    """Every video frame of the MP4 at `path` as uint8 RGB, (frames, height, width, 3)."""
    import av

    with av.open(str(path)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    if not frames:
        raise ValueError(f"{path}: no video frames")
    return np.stack(frames)


def frame_diff(a: np.ndarray, b: np.ndarray) -> FrameDiff:
    """PSNR and SSIM of each frame of `b` against `a` (same shape, uint8 RGB), and the worst frame's difference."""
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    if a.shape != b.shape:
        raise ValueError(f"the videos differ in shape: {a.shape} against {b.shape}")
    psnr, ssim = [], []
    for x, y in zip(a, b):
        psnr.append(float("inf") if np.array_equal(x, y) else float(peak_signal_noise_ratio(x, y, data_range=255)))
        ssim.append(float(structural_similarity(x, y, channel_axis=-1, data_range=255)))
    worst = int(np.argmin(ssim))
    delta = np.abs(a[worst].astype(np.int16) - b[worst].astype(np.int16))
    top = int(delta.max())
    scaled = (delta * (255.0 / top)).round().astype(np.uint8) if top else delta.astype(np.uint8)
    return FrameDiff(psnr, ssim, worst, scaled, top)


def request_mismatch(a: dict, b: dict) -> list[str]:
    """The generate fields (`SAME_REQUEST`) in which two jobs' specs differ; [] when their frames compare."""
    pa, pb = ((job.get("spec") or {}).get("generate") or {} for job in (a, b))
    return [name for name in SAME_REQUEST if pa.get(name) != pb.get(name)]


def total_seconds(job: dict) -> float | None:
    started, finished = job.get("started_at"), job.get("finished_at")
    return finished - started if started is not None and finished is not None else None


def cost_deltas(a: dict, b: dict) -> list[dict[str, str]]:
    """Rows (cost, A, B, B - A, B / A) for peak memory, s/step and total time."""
    ma, mb = a.get("metrics") or {}, b.get("metrics") or {}
    rows = []
    for name, va, vb, show in (
        ("peak memory", ma.get("peak_footprint"), mb.get("peak_footprint"), fmt.gib),
        ("s/step", seconds_per_step(a, None, 0.0), seconds_per_step(b, None, 0.0), lambda v: f"{v:.3f} s"),
        ("total time", total_seconds(a), total_seconds(b), fmt.duration),
    ):
        both = va is not None and vb is not None
        rows.append({
            "cost": name,
            "A": show(va) if va is not None else fmt.MISSING,
            "B": show(vb) if vb is not None else fmt.MISSING,
            "B - A": (("+" if vb >= va else "-") + show(abs(vb - va))) if both else fmt.MISSING,
            "B / A": f"{vb / va:.2f}x" if both and va else fmt.MISSING,
        })
    return rows
