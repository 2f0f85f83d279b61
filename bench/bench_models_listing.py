"""How long the Models listing takes over many checkpoints, headers only (not a test).

    python bench/bench_models_listing.py [--count 50] [--profile tiny]

Writes `--count` checkpoints of the given profile's layout into a temporary folder, half as plain diffusers
folders and half as Hugging Face cache snapshots (links into blobs), each safetensors file holding its real
header and a hole where its data would be (a sparse file: the listing reads headers only, so the values do not
matter). Then times `loader.catalog.find_models` over both folders, as the Models page and `python -m loader
models` call it, best of three runs after one warm-up, and prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loader.catalog import find_models  # noqa: E402
from tests.hub_layout import hub_snapshot  # noqa: E402


def headers_only_copy(source: Path, target: Path) -> None:
    """`source`'s tree with every safetensors file cut to its header and extended to its size as a hole."""
    for path in sorted(source.rglob("*")):
        out = target / path.relative_to(source)
        if path.is_dir():
            out.mkdir(parents=True, exist_ok=True)
        elif path.name.endswith(".safetensors"):
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "rb") as f:
                head = f.read(8)
                header = f.read(struct.unpack("<Q", head)[0])
            with open(out, "wb") as f:
                f.write(head + header)
                f.truncate(path.stat().st_size)
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--profile", default="tiny")
    args = parser.parse_args()
    from models.synth.writer import synth_h3
    from models.synth.profiles import get_profile

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        synth_h3(tmp / "source", get_profile(args.profile), seed=0)
        folder, hub = tmp / "models", tmp / "hub"
        for i in range(args.count):
            if i % 2:
                headers_only_copy(tmp / "source", tmp / "staged" / f"h3-{i}")
                hub_snapshot(tmp / "staged" / f"h3-{i}", hub, repo_id=f"org/h3-{i}")
            else:
                headers_only_copy(tmp / "source", folder / f"h3-{i}")
        find_models([folder, hub], 2**40)  # warm-up: imports, the page cache
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            entries = find_models([folder, hub], 2**40)
            runs.append(time.perf_counter() - start)
        print(json.dumps({"checkpoints": len(entries), "profile": args.profile,
                          "components": sum(len(e.components) for e in entries),
                          "broken": sum(bool(e.problems) for e in entries), "seconds_best": round(min(runs), 3),
                          "seconds_runs": [round(r, 3) for r in runs], "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
