"""Generate forecast vs measurement, stage by stage, in one process (not a test).

    python bench/bench_generate.py ROOT [--device cpu] [--frames 124] [--height H --width W] [--steps 3]
        [--sequential / --no-sequential] [--unified] [--json OUT.json]
        [--workflow ref2va --ref-video CLIP.mp4 [--ref-image IMAGE]] [--workflow fl2va --image IMAGE]

Runs `models.forecast_generate` and then `models.run_generate` on the same parameters and prints, per
computing stage, the predicted bytes and the measured peak (VmRSS + CUDA allocated) above the peak of the
`prepare` stage (pipeline built and every library imported, no weight read yet), with their ratio; then
host (VmRSS above `prepare`) and device (allocated, and reserved: what the forecast's device column
predicts, the CUDA context aside) predicted / measured. `--unified` forces the unified-memory policy (as
DRAINBOARD_UNIFIED_MEMORY=1 does): every offload flag off, sequential residency on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from loader.process import configure_process  # noqa: E402

configure_process()  # an entry point: the hub offline, the mmap threshold fixed, as a job child


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--frames", type=int, default=124)
    parser.add_argument("--height", type=int)
    parser.add_argument("--width", type=int)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sequential", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--unified", action="store_true")
    parser.add_argument("--json", help="write the forecast, the result and the comparison here")
    parser.add_argument("--workflow", default="t2va", choices=("t2va", "fl2va", "ref2va"))
    parser.add_argument("--image", help="fl2va's first frame")
    parser.add_argument("--ref-image", help="ref2va's reference image")
    parser.add_argument("--ref-video", help="ref2va's reference clip (MP4 or MOV)")
    args = parser.parse_args()
    if args.unified:
        os.environ["DRAINBOARD_UNIFIED_MEMORY"] = "1"

    from machine.device import probe_device
    from machine.memory import MemoryProbe
    from machine.offload import OffloadSettings
    from models.forecast import forecast_generate
    from models.request.params import GenerateParams
    from models.run.pipeline import run_generate

    params = GenerateParams(prompt="a red fox running through fresh snow at dawn", frames=args.frames,
                            height=args.height, width=args.width, steps=args.steps, workflow=args.workflow,
                            image=args.image, ref_image=args.ref_image, ref_video=args.ref_video)
    info = probe_device(args.device)
    forecast = forecast_generate(args.root, params, device_info=info, settings=OffloadSettings(),
                                 sequential_components=args.sequential)
    with MemoryProbe(args.device if args.device.startswith("cuda") else None) as probe, \
            tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        split: dict[str, dict[str, int]] = {}

        def on_sample(stage, sample) -> None:
            peaks = split.setdefault(stage, {"host": 0, "allocated": 0, "reserved": 0})
            peaks["host"] = max(peaks["host"], sample.vm_rss)
            peaks["allocated"] = max(peaks["allocated"], sample.device_allocated)
            peaks["reserved"] = max(peaks["reserved"], sample.device_reserved)

        configure_process(args.device)  # the device's settings, before anything pins
        result = run_generate(args.root, params, Path(tmp) / "clip.mp4", device=args.device, device_info=info,
                              sequential_components=args.sequential, probe=probe, sample_interval=0.005,
                              on_sample=on_sample)
        wall = time.monotonic() - start
    baseline = result.stage_peaks["prepare"]
    rows = []
    print(f"{args.root}: {forecast.width}x{forecast.height}, {params.frames} frames, {params.steps} steps,"
          f" {forecast.tokens} tokens, sequential={result.sequential_components}, on {info.name}; {wall:.1f} s")
    print(f"{'stage':<18}{'predicted MiB':>15}{'measured MiB':>15}{'ratio':>8}{'seconds':>9}"
          f"{'host p/m MiB':>20}{'device p/m (reserved) MiB':>30}")
    base = split.get("prepare", {"host": 0, "allocated": 0, "reserved": 0})
    for stage in forecast.stages:
        measured = max(result.stage_peaks.get(stage.stage, 0) - baseline, 0)
        ratio = stage.total_bytes / measured if measured else float("nan")
        peaks = split.get(stage.stage, base)
        host = peaks["host"] - base["host"]
        rows.append({"stage": stage.stage, "predicted_bytes": stage.total_bytes, "measured_bytes": measured,
                     "ratio": ratio, "seconds": result.stage_seconds.get(stage.stage, 0.0),
                     "predicted_host_bytes": stage.host_bytes, "predicted_device_bytes": stage.device_bytes,
                     "measured_host_bytes": host, "measured_allocated_bytes": peaks["allocated"],
                     "measured_reserved_bytes": peaks["reserved"]})
        print(f"{stage.stage:<18}{stage.total_bytes / 2**20:15.1f}{measured / 2**20:15.1f}{ratio:8.2f}"
              f"{rows[-1]['seconds']:9.2f}{stage.host_bytes / 2**20:>10.1f}/{host / 2**20:<9.1f}"
              f"{stage.device_bytes / 2**20:>12.1f}/{peaks['allocated'] / 2**20:.1f} ({peaks['reserved'] / 2**20:.1f})")
    peak = max(result.stage_peaks.values()) - baseline
    print(f"{'peak':<18}{forecast.predicted_peak_bytes / 2**20:15.1f}{peak / 2**20:15.1f}"
          f"{forecast.predicted_peak_bytes / peak:8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"forecast": forecast.to_dict(), "result": result.to_dict(),
                                               "baseline_bytes": baseline, "wall_seconds": wall,
                                               "prompt": params.prompt, "steps": params.steps,
                                               "stages": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
