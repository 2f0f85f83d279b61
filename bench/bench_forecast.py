"""Forecast accuracy benchmark (not a test): `forecast_load` against the measured footprint_ratio.

Writes three component folders of the same tensors with different shard
sizes (one file, 128 MiB shards, 16 MiB shards; bf16 weights with fp32 norms),
then for each placement mode (and a dtype-converting stream and drain load)
predicts the peak from metadata and measures the load in a fresh process, as
bench/bench_load.py does, in a warm page cache. Prints one table.

    python bench/bench_forecast.py --out /tmp/forecast_ckpts [--size 512MiB] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_MiB = 1 << 20
SHARDINGS = {"one-file": None, "128MiB-shards": 128 * _MiB, "16MiB-shards": 16 * _MiB}
CASES = (("stream", None), ("drain", None), ("retain", None), ("stream", "fp32"), ("drain", "fp32"))


def make_checkpoint(folder: Path, size: int, shard_size: int | None) -> Path:
    """A component folder of 2048 x 2048 bf16 weights (8 MiB each) with a 2048 fp32 norm per block,
    deterministic and never zero, split into shards of about `shard_size` with an index."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(2048, 2048, generator=generator).add_(3).to(torch.bfloat16)
    names = []
    for block in range(max(1, size // (8 * _MiB))):
        names += [(f"blocks.{block}.proj.weight", "w"), (f"blocks.{block}.norm.weight", "n")]
    shards: list[list[tuple[str, str]]] = [[]]
    used = 0
    for name, kind in names:
        nbytes = 8 * _MiB if kind == "w" else 2048 * 4
        if shard_size is not None and shards[-1] and used + nbytes > shard_size:
            shards.append([])
            used = 0
        shards[-1].append((name, kind))
        used += nbytes
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"diffusion_pytorch_model-{i:05d}-of-{len(shards):05d}.safetensors"
        tensors = {n: (base * (1 + j / 64)) if k == "w" else torch.full((2048,), 1.0 + j) for j, (n, k) in enumerate(shard)}
        save_file(tensors, str(folder / file))
        weight_map.update({n: file for n, _ in shard})
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({"_class_name": "BenchForecastSynthetic"}))
    return folder


def _warm(folder: Path) -> None:
    for file in sorted(folder.glob("*.safetensors")):
        with open(file, "rb") as f:
            while f.read(64 * _MiB):
                pass


def _child(path: Path, mode: str, dtype: str | None) -> dict:
    from loader import LoadOptions, load_checkpoint

    _, report = load_checkpoint(path, LoadOptions(mode=mode, dtype=dtype))
    return {"footprint_ratio": report.footprint_ratio, "bytes_placed": report.bytes_placed}


def _measure(path: Path, mode: str, dtype: str | None) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, str(path)] + (["--dtype", dtype] if dtype else [])
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"child {mode} {path} failed: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads(result.stdout)


def run(out: Path, size: int) -> list[dict]:
    from loader.forecast import forecast_load

    rows = []
    for label, shard_size in SHARDINGS.items():
        folder = out / label
        if not folder.exists():
            make_checkpoint(folder, size, shard_size)
        _warm(folder)
        for mode, dtype in CASES:
            predicted = forecast_load(folder, mode=mode, dtype=dtype)
            measured = _measure(folder, mode, dtype)
            if measured["bytes_placed"] != predicted.bytes_placed:
                raise SystemExit(f"{label} {mode}: placed {measured['bytes_placed']} != forecast {predicted.bytes_placed}")
            rows.append({
                "checkpoint": label, "shards": len(list(folder.glob("*.safetensors"))), "mode": mode,
                "dtype": dtype or "as stored", "predicted": predicted.predicted_footprint_ratio,
                "measured": measured["footprint_ratio"],
                "error": predicted.predicted_footprint_ratio / measured["footprint_ratio"] - 1,
            })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", type=Path, help="(child) checkpoint to load")
    parser.add_argument("--out", type=Path, help="folder for the three checkpoints (reused if present)")
    parser.add_argument("--size", default="512MiB", help="checkpoint size, in MiB (default 512MiB)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--dtype")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.path, args.child, args.dtype)))
        return
    if args.out is None:
        parser.error("--out is required")
    size = int(args.size.lower().removesuffix("mib")) * _MiB
    rows = run(args.out, size)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("| checkpoint | shards | mode | dtype | predicted | measured | error |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['checkpoint']} | {r['shards']} | {r['mode']} | {r['dtype']} | {r['predicted']:.3f}"
              f" | {r['measured']:.3f} | {r['error'] * 100:+.1f}% |")


if __name__ == "__main__":
    main()
