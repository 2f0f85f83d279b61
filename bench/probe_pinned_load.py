"""Probe (not a test): a CPU load into pinned blocks (`pin_host`) against one into ordinary pages, each in a
fresh process, on a CUDA host.

    python bench/probe_pinned_load.py [--dir /dev/shm/pinned-load] [--gib 8]

Writes one safetensors file of `--gib` GiB of bf16 in `--dir` (tmpfs: the read is from RAM), then loads it
with `load_checkpoint(..., LoadOptions(skeleton=True))` three ways: pageable, and pinned twice; and, first, carves the same
bytes from a `PinnedHostArena` alone. Prints each case's seconds, whether torch's pinned allocator was
switched to host registration, and its block count.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[3])
import torch
torch.empty(0, device="cuda")
import loader.io.host_blocks as hb
from loader import LoadOptions, load_checkpoint
from loader.process import configure_process
configure_process("cuda")  # as every entry point on a CUDA device: the pinned allocator switched first
case, folder = sys.argv[1], sys.argv[2]
out = {"case": case}
t = time.perf_counter()
if case == "arena only":
    nbytes = sum(p.stat().st_size for p in __import__("pathlib").Path(folder).glob("*.safetensors"))
    arena = hb.PinnedHostArena(nbytes)
    tensors = [arena.empty((1 << 28,), torch.float32) for _ in range(nbytes >> 30)]
else:
    module, report = load_checkpoint(folder, LoadOptions(skeleton=True, pin_host=case.startswith("pinned")))
    out["pinned_gib"] = report.host_pinned_bytes / 2**30
    out["note"] = report.host_pinned_note
out["seconds"] = round(time.perf_counter() - t, 3)
out["host_registration"] = hb._register_mode
out["blocks"] = torch.cuda.host_memory_stats().get("num_host_alloc")
print(json.dumps(out))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/dev/shm/pinned-load")
    parser.add_argument("--gib", type=int, default=8)
    args = parser.parse_args()
    import torch
    from safetensors.torch import save_file

    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({f"w{i}": torch.full((8192, 8192), float(i), dtype=torch.bfloat16) for i in range(8 * args.gib)},
              str(folder / "model.safetensors"))  # 128 MiB each
    for case in ("arena only", "pageable", "pinned", "pinned again"):
        run = subprocess.run([sys.executable, "-c", _CHILD, case, str(folder), str(REPO)], capture_output=True,
                             text=True)
        print(run.stdout.strip() or f"{case}: failed: {run.stderr.strip()[-800:]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
