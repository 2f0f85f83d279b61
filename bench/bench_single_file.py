"""A single-file DiT in the original layout against the same DiT in the diffusers folder: the loader's footprint
for each, side by side (not a test).

    python bench/bench_single_file.py [--profile demo] [--mode stream] [--repeat 3]

Writes the profile's checkpoint, then its DiT as one file in the reference layout (fused qkv, `[gate; value]`,
the data area at 5 mod 8 so no tensor is aligned), and loads the DiT both ways at bfloat16 in fresh
processes, interleaved: `models.checkpoint.components.load_component` from the folder, and with `single_file=` (the
split rules). Prints one JSON line per load (the LoadReport's footprint_ratio, host_peak_ratio, bytes read and
placed, seconds) and the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def child(root: str, single: str | None, mode: str) -> dict:
    import torch

    from models.checkpoint.components import load_component

    _, report = load_component(root, "transformer", dtype=torch.bfloat16, mode=mode, single_file=single)
    r = report.to_dict()
    return {k: r[k] for k in ("footprint_ratio", "host_peak_ratio", "bytes_read", "bytes_placed", "load_seconds")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="demo")
    parser.add_argument("--mode", default="stream")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        root, single = args.child
        print(json.dumps(child(root, single or None, args.mode)))
        return
    from models.synth.writer import synth_h3
    from models.synth.profiles import get_profile
    from tests.models.reference_layout import reference_tensors, write_single_file

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / args.profile
        synth_h3(root, get_profile(args.profile), seed=0, components=["transformer"])
        single = write_single_file(reference_tensors(root / "transformer"), Path(tmp) / "dit.safetensors",
                                   data_start_mod8=5)
        results: dict[str, list[dict]] = {"folder": [], "single_file": []}
        for _ in range(args.repeat):
            for case, file in (("folder", ""), ("single_file", str(single))):
                out = subprocess.run([sys.executable, __file__, "--mode", args.mode, "--child", str(root), file],
                                     cwd=REPO, capture_output=True, text=True, check=True).stdout
                row = json.loads(out.strip().splitlines()[-1])
                results[case].append(row)
                print(json.dumps({"case": case, **row}))
        print(json.dumps({"profile": args.profile, "mode": args.mode, **{
            case: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for case, rows in results.items()}}))


if __name__ == "__main__":
    main()
