"""What the Run page pays per rerun for one checkpoint of 200,000 tensors: first ask against asking again.

    python bench/bench_discovery.py [--tensors 200000]

Writes one .safetensors file of N one-element float32 tensors (an 18 MB header) under a fresh model root,
then times, side by side in this one process, each step a Run page rerun takes with it chosen, first
(files never seen) and again (the same files; remembered by their identity):

- `listing`: the Run page's checkpoint picker (`dashboard.views.checkpoints.find_checkpoints`);
- `submit check`: `jobs.spec.build_spec` of a load job on it (the loader's check every submit runs);
- `forecast`: `loader.forecast_load` of a CPU stream load (remembered by the same identity);

and after a `touch` of the file (another mtime, so another identity: discovered anew). The file is dated a
minute back first: a tree changed in the last 2 s is never remembered. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def write_checkpoint(path: Path, tensors: int) -> None:
    """One file of `tensors` one-element float32 tensors, named like a DiT's."""
    header = {f"blocks.{i // 100}.layer.{i % 100}.weight": {"dtype": "F32", "shape": [1],
                                                             "data_offsets": [4 * i, 4 * i + 4]}
              for i in range(tensors)}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.write(bytes(4 * tensors))


def settle(path: Path, seconds_ago: float) -> None:
    """Set the file's mtime `seconds_ago` in the past."""
    when = time.time_ns() - int(seconds_ago * 1e9)
    os.utime(path, ns=(when, when))


def timed(step) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=200_000)
    args = parser.parse_args()

    from dashboard.views.checkpoints import find_checkpoints
    from jobs.spec import build_spec
    from loader.forecast import forecast_load
    from storage.config import load_config

    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models"
        models.mkdir()
        checkpoint = models / "big.safetensors"
        write_checkpoint(checkpoint, args.tensors)
        settle(checkpoint, 60)  # a tree changed in the last 2 s is never remembered (`loader.checkpoint.SETTLED_NS`)
        os.environ.update(DRAINBOARD_DATA=str(Path(tmp) / "data"), DRAINBOARD_MODEL_ROOTS=str(models))
        config = load_config()
        steps = {
            "listing": lambda: find_checkpoints([models]),
            "submit check": lambda: build_spec({"kind": "load", "model": str(checkpoint)}, config),
            "forecast": lambda: forecast_load(checkpoint, roots=[models]),
        }
        rows = {name: {"first_s": timed(step)} for name, step in steps.items()}
        for name, step in steps.items():
            rows[name]["again_s"] = timed(step)
        settle(checkpoint, 30)  # a new mtime: another identity
        for name, step in steps.items():
            rows[name]["after_touch_s"] = timed(step)
        for row in rows.values():
            row["first_over_again"] = round(row["first_s"] / max(row["again_s"], 1e-9), 1)
        print(json.dumps({"tensors": args.tensors, "header_bytes": checkpoint.stat().st_size - 4 * args.tensors,
                          "steps": rows}, indent=1))


if __name__ == "__main__":
    main()
