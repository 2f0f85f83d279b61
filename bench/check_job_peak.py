"""The whole job's predicted peak (process learned from this machine's past jobs, plus the largest stage) against
the peak the job measured, through real jobs and a real worker (not a test).

    python bench/check_job_peak.py [--profile tiny] [--history 2] [--geometry 96x64x141 --geometry 128x96x124]

Writes the profile and a fresh data folder under a temporary directory, runs `--history` generate jobs at the
profile's own canvas (their process is what the next jobs learn; no stage term was fitted on the geometries
checked), then submits each `--geometry` (WIDTHxHEIGHTxFRAMES, 3 steps) with `python -m jobs submit --wait` and
prints the forecast's `job_peak` (stored on the spec at submit) beside the job's measured `peak_footprint`
(VmRSS plus device memory at its largest sample) and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20


def submit(env: dict[str, str], model: Path, *extra: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "jobs", "submit", "generate", "--model", str(model), "--prompt",
                          "a red fox running through fresh snow", "--steps", "3", "--wait", "--json", *extra],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    job = json.loads(out.stdout) if out.stdout.strip() else {}
    if "spec" not in job:
        raise SystemExit(f"submit {' '.join(extra)}: {job.get('error') or out.stderr[-2000:]}")
    return job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--history", type=int, default=2, help="jobs run first, at the profile's canvas")
    parser.add_argument("--geometry", action="append", help="WIDTHxHEIGHTxFRAMES (default: 96x64x141, 128x96x124)")
    args = parser.parse_args()
    geometries = args.geometry or ["96x64x141", "128x96x124"]
    with tempfile.TemporaryDirectory() as tmp:
        data, models = Path(tmp) / "data", Path(tmp) / "models"
        model = models / args.profile
        subprocess.run([sys.executable, "-m", "models", "synth", str(model), "--profile", args.profile], cwd=ROOT,
                       check=True, capture_output=True)
        env = {**os.environ, "DRAINBOARD_DATA": str(data), "DRAINBOARD_MODEL_ROOTS": str(models)}
        for _ in range(args.history):
            submit(env, model)
        rows = []
        for geometry in geometries:
            width, height, frames = geometry.split("x")
            job = submit(env, model, "--width", width, "--height", height, "--frames", frames)
            forecast = job["spec"]["forecast"]
            measured = (job.get("metrics") or {}).get("peak_footprint")
            rows.append({"geometry": geometry, "status": job["status"], "basis": forecast["process"]["basis"],
                         "process_ready_mib": (forecast["process"]["ready_bytes"] or 0) / MiB,
                         "predicted_mib": (forecast["job_peak"] or 0) / MiB,
                         "measured_mib": (measured or 0) / MiB,
                         "ratio": forecast["job_peak"] / measured if forecast["job_peak"] and measured else None})
        print(f"{'geometry':<12}{'process':>10}{'predicted':>11}{'measured':>10}{'ratio':>8}  basis")
        for r in rows:
            ratio = f"{r['ratio']:.3f}" if r["ratio"] else "-"
            print(f"{r['geometry']:<12}{r['process_ready_mib']:>10.0f}{r['predicted_mib']:>11.0f}"
                  f"{r['measured_mib']:>10.0f}{ratio:>8}  {r['basis']} ({r['status']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
