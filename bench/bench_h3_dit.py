"""A real-size synthetic MiniMax H3 DiT loaded with `stream` into diffusers' class (not a test).

Writes the `h3` profile's transformer (the release's 5376-wide blocks; as many of the 50 blocks as
the target filesystem holds, all of them when it has room) with `models.synth.writer`, then loads it
with `models.checkpoint.components.load_component(..., mode="stream")` in a fresh child process and prints
the loader's report (GB/s, footprint_ratio) as one JSON object.

    python bench/bench_h3_dit.py /tmp/h3 --device cuda --json     # on the GPU host
    python bench/bench_h3_dit.py /tmp/h3 --profile tiny --json    # a dry run of the script anywhere
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_LOAD = """
import json, sys, torch
from models.checkpoint.components import load_component
module, report = load_component(sys.argv[1], "transformer", mode="stream", device=sys.argv[2], dtype="bf16")
out = report.to_dict()
for key in ("loaded", "missing", "unexpected", "skipped", "excluded"):
    out.pop(key, None)
out["class"] = type(module).__name__
out["blocks"] = len(module.transformer_blocks)
out["parameters"] = sum(p.numel() for p in module.parameters())
out["rope_inv_freq_device"] = str(module.rope.inv_freq.device)
print(json.dumps(out))
"""


def with_blocks(profile, blocks: int):
    """`profile`'s transformer alone, with `blocks` transformer blocks."""
    return dataclasses.replace(profile, transformer={**profile.transformer, "num_layers": blocks},
                               components=("transformer",))


def block_bytes(profile) -> tuple[int, int]:
    """(bytes of one transformer block, bytes of everything else) of `profile`'s DiT as stored."""
    from models.synth.writer import synth_h3

    b1, b2 = (synth_h3("unused", with_blocks(profile, n), dry_run=True).components[0].bytes for n in (1, 2))
    return b2 - b1, 2 * b1 - b2


def blocks_that_fit(profile, free: int, margin: int) -> int:
    """How many transformer blocks of `profile` fit in `free` bytes, keeping `margin` spare."""
    block, rest = block_bytes(profile)
    return max(0, (free - margin - rest) // block)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write the checkpoint into")
    parser.add_argument("--profile", default="h3")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--margin", type=float, default=1.0, help="GiB left free on the filesystem (default 1)")
    parser.add_argument("--write-seconds", type=float, default=None,
                        help="also cap the blocks at what a one-block probe says this host writes in that time")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from models.synth.writer import synth_h3
    from models.synth.profiles import get_profile

    profile = get_profile(args.profile)
    full_blocks = profile.transformer.get("num_layers", 50)
    args.out.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.out).free
    blocks = min(full_blocks, blocks_that_fit(profile, free, int(args.margin * 2**30)))
    if blocks < 1:
        print(f"{args.out}: {free:,} bytes free, not one block fits", file=sys.stderr)
        return 2
    probe_rate = None
    if args.write_seconds is not None:
        start = time.perf_counter()
        [one] = synth_h3(args.out, with_blocks(profile, 1), components=["transformer"]).components
        probe_rate = one.bytes / (time.perf_counter() - start)
        block, rest = block_bytes(profile)
        blocks = max(1, min(blocks, int((probe_rate * args.write_seconds - rest) // block)))
    start = time.perf_counter()
    [dit] = synth_h3(args.out, with_blocks(profile, blocks), components=["transformer"]).components
    write_seconds = time.perf_counter() - start
    done = subprocess.run([sys.executable, "-c", _LOAD, str(args.out), args.device], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    if done.returncode != 0:
        print(done.stderr[-4000:], file=sys.stderr)
        return 1
    result = {"profile": args.profile, "blocks": blocks, "of_blocks": full_blocks, "free_bytes_before": free,
              "tensors": dit.tensors, "checkpoint_bytes": dit.bytes, "write_seconds": round(write_seconds, 1),
              "probe_write_gbps": None if probe_rate is None else round(probe_rate / 1e9, 2),
              "load": json.loads(done.stdout.strip().splitlines()[-1])}
    print(json.dumps(result, indent=2) if args.json else result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
