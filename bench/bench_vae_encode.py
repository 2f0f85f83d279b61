"""The video VAE's encode of a condition (an image, or a ref2va reference clip), alone, memory per case (not a test).

    python bench/bench_vae_encode.py ROOT --device cuda --case 124x768x1344 --case 124x576x1024 --case 1x2048x3648
    python bench/bench_vae_encode.py ROOT --device cpu --case 124x64x128

ROOT is an H3 checkpoint with a `vae/` folder (for the real size, `python -m models synth DIR --profile h3
--components vae`; memory does not depend on the weights' values). Each case (frames x height x width, uint8
pixels on the device as diffusers' ref2va encoder step puts them) runs in a fresh process: the VAE loaded by
Drainboard's loader at bf16 with its tiling as the pipeline leaves it, then diffusers' own `encode_vae_condition`.
Prints one JSON line per case: the pixels, the device's peak allocated and reserved above the weights (what
`models.forecast`'s `vae_encoder` term predicts on CUDA), the host's peak VmRSS above the loaded VAE (on a CPU,
that term), and the seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from loader.process import configure_process  # noqa: E402

configure_process()  # an entry point: the hub offline, the mmap threshold fixed, as a job child


def child(root: str, device: str, case: str) -> dict:
    import numpy as np
    import torch
    from diffusers.modular_pipelines.minimax_h3.encoders import encode_vae_condition

    from models.checkpoint.components import load_component

    frames, height, width = (int(x) for x in case.split("x"))
    cuda = device.startswith("cuda")
    vae, _ = load_component(root, "vae", device=device, dtype=torch.bfloat16)
    pixels = torch.from_numpy(np.random.RandomState(0).randint(0, 256, (frames, height, width, 3), dtype=np.uint8))
    if cuda:
        torch.cuda.synchronize()
        weights = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    base = _status("VmRSS")
    start = time.monotonic()
    with torch.no_grad():
        on_device = pixels.to(device).permute(3, 0, 1, 2)[None]
        latents = encode_vae_condition(vae, on_device, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    if cuda:
        torch.cuda.synchronize()
    out = {"case": case, "pixels": frames * height * width, "latents": list(latents.shape),
           "seconds": time.monotonic() - start, "host_peak_above_vae": _status("VmHWM") - base}
    if cuda:
        out |= {"weights": weights, "peak_allocated_above_weights": torch.cuda.max_memory_allocated() - weights,
                "peak_reserved_above_weights": torch.cuda.max_memory_reserved() - weights}
    return out


def _status(key: str) -> int:
    """A /proc/self/status size (VmRSS, VmHWM: the peak resident set) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--case", action="append", required=True, help="FRAMESxHEIGHTxWIDTH")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.root, args.device, args.case[0])))
        return 0
    for case in args.case:
        run = subprocess.run([sys.executable, __file__, args.root, "--device", args.device, "--case", case, "--child"],
                             capture_output=True, text=True)
        lines = run.stdout.strip().splitlines()
        print(lines[-1] if run.returncode == 0 and lines else
              json.dumps({"case": case, "exit": run.returncode, "error": run.stderr.strip().splitlines()[-3:]}),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
