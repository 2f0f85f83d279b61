"""The precision knobs measured: VAE decode precision (and tiling), and the quantized DiT (not a test).

    python bench/bench_knobs.py vae ROOT [--device cuda] [--height 768 --width 1344] [--frames 124] [--untiled]
    python bench/bench_knobs.py quant ROOT [--device cuda] [--kinds int8 fp8] [--height H --width W] [--steps 4]

`vae`: decodes the same seeded latents (the shape a clip of that canvas and length has) with the video VAE
in fp32 (the checkpoint's) and in bf16, tiled, and with `--untiled` also fp32 untiled; prints one JSON
line per case: decode seconds, peak bytes during the decode (CUDA: max allocated; CPU: VmRSS high-water
of the process), and PSNR of the frames against the fp32 tiled decode.

`quant`: generates the same seed in bf16 and under each quantization and prints one JSON line per run:
the DiT's bytes held, denoise seconds and peak, and the frames' PSNR against bf16 (quantized frames are
not bit-identical to bf16's).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from loader.process import configure_process  # noqa: E402

configure_process()  # an entry point: the hub offline, the mmap threshold fixed, as a job child


def psnr(test, reference) -> float:
    """PSNR in dB of frames in [0, 1] (inf when identical)."""
    import numpy as np

    mse = float(np.mean((np.asarray(test, np.float64) - np.asarray(reference, np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def _peak_reset(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device) -> int:
    import resource

    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def vae_cases(root: str, device: str, height: int | None, width: int | None, frames: int, untiled: bool) -> list[dict]:
    """One row per VAE case (see the module docstring)."""
    import torch

    from models.checkpoint.components import load_component
    from models.request.params import GenerateParams, ModelSpec

    spec = ModelSpec.read(root)
    h, w = spec.geometry(GenerateParams(prompt="x", height=height, width=width))
    latent_frames = (frames - spec.latents_per_chunk) // spec.frames_per_chunk * spec.latents_per_chunk \
        + spec.latents_per_chunk
    channels = int(spec.configs["vae"].get("latent_channels", 24))
    dev = torch.device(device)
    latents = torch.randn(1, channels, latent_frames, h // spec.spatial_compression, w // spec.spatial_compression,
                          generator=torch.Generator("cpu").manual_seed(0))
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MiniMaxH3ModularPipeline

    pipe = MiniMaxH3ModularPipeline()  # the pixel statistics the decode step reverts, as diffusers' own step does
    pixel_mean = torch.tensor(pipe.pixel_mean).view(1, -1, 1, 1, 1)
    pixel_std = torch.tensor(pipe.pixel_std).view(1, -1, 1, 1, 1)
    cases = [("fp32", True), ("bf16", True)] + ([("fp32", False)] if untiled else [])
    rows, reference = [], None
    for precision, tiled in cases:
        vae, _ = load_component(root, "vae", device=device,
                                dtype=torch.float32 if precision == "fp32" else torch.bfloat16)
        if not tiled:
            vae.disable_tiling()
        _peak_reset(dev)
        start = time.perf_counter()
        with torch.no_grad():
            video = vae.decode(latents.to(dev, next(vae.decoder.parameters()).dtype), return_dict=False)[0]
        frames01 = (video.float().cpu() * pixel_std + pixel_mean).clamp(0, 1).numpy()
        seconds, peak = time.perf_counter() - start, _peak(dev)
        reference = frames01 if reference is None else reference
        rows.append({"case": f"vae {precision} {'tiled' if tiled else 'untiled'}", "canvas": [w, h],
                     "decode_s": round(seconds, 3), "peak_bytes": peak,
                     "psnr_vs_fp32_tiled_db": psnr(frames01, reference)})
        del vae
    return rows


def quant_cases(root: str, device: str, kinds: list[str], height: int | None, width: int | None,
                steps: int) -> list[dict]:
    """One row per DiT precision (see the module docstring)."""
    import av
    import numpy as np

    from models.request.params import GenerateParams
    from models.run.pipeline import run_generate

    params = GenerateParams(prompt="a red fox running through fresh snow", height=height, width=width, steps=steps,
                            seed=0, audio=False)
    rows, reference = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for kind in [None, *kinds]:
            configure_process(device)  # the device's settings, before anything pins
            result = run_generate(root, replace(params, quantize=kind), Path(tmp) / f"{kind}.mp4", device=device)
            with av.open(result.out_path) as c:
                frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)]) / 255.0
            reference = frames if reference is None else reference
            dit = result.loads["transformer"]
            rows.append({"case": f"dit {kind or 'bf16'}", "dit_bytes": dit.get("bytes_held", dit["bytes_placed"]),
                         "denoise_s": round(result.stage_seconds["denoise.denoise"], 3),
                         "denoise_peak_bytes": result.stage_peaks["denoise.denoise"],
                         "psnr_vs_bf16_db": psnr(frames, reference)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("vae", "quant"):
        p = sub.add_parser(name)
        p.add_argument("root")
        p.add_argument("--device", default="cpu")
        p.add_argument("--height", type=int)
        p.add_argument("--width", type=int)
    sub.choices["vae"].add_argument("--frames", type=int, default=124)
    sub.choices["vae"].add_argument("--untiled", action="store_true", help="also decode fp32 without tiling")
    sub.choices["quant"].add_argument("--kinds", nargs="+", default=["int8"], choices=["int8", "fp8"])
    sub.choices["quant"].add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    if args.what == "vae":
        rows = vae_cases(args.root, args.device, args.height, args.width, args.frames, args.untiled)
    else:
        rows = quant_cases(args.root, args.device, args.kinds, args.height, args.width, args.steps)
    for row in rows:
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
