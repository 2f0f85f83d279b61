"""One clip over N GPUs against one (`--parallel N` against 1), side by side in one invocation (not a test).

At real size on a host with 2 GPUs (a zero-weight sparse `h3` checkpoint: headers written, data holes):

    python bench/bench_parallel.py --work /dev/shm/h3par --device cuda --ranks 2 --out "$OUT"

A dry run of the harness on a CPU (the tiny profile). diffusers' context parallelism needs an accelerator to
place its ranks, so the dry run reports one to every process, as the tests do (`tests/fake_accelerator`):

    python bench/bench_parallel.py --profile tiny --work /tmp/h3par --device cpu --height 64 --width 64 --steps 3 \\
        --fake-accelerator

Each run is `python -m models generate ROOT --json --sequential-components --no-audio` in a fresh process, first
with `--parallel 1`, then `--parallel N`, at the same prompt, canvas, frames and steps. The prompt is lengthened
by a word at a time until the packed sequence (the forecast's rows: text tokens + video and audio rows) divides
by N, as diffusers' sharder requires. Printed: denoise seconds per DiT call and their ratio (goal: <= 0.6x), each
rank's peak per stage (VmRSS + CUDA allocated, the run's `stage_peaks`) against the single run's (goal: per-rank
peak <= the single peak), and each run's wall time (start-up included). `--out` gets parallel.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

GIB = 1024**3


def ensure_checkpoint(profile: str, work: Path) -> Path:
    """The profile's checkpoint under `work`: zero-weight and sparse for `h3` (holes, no bytes written), random for
    the small profiles; reused when complete."""
    root = work / profile
    if (root / "modular_model_index.json").exists():
        return root
    if profile == "h3":
        from check_forecast_cuda import write_sparse_h3

        write_sparse_h3(root, profile, components=["text_encoder", "tokenizer", "processor", "transformer", "vae",
                                                   "audio_vae", "scheduler", "audio_scheduler"])
    else:
        from models.synth.writer import synth_h3
        from models.synth.profiles import get_profile

        synth_h3(root, get_profile(profile), seed=0)
    return root


def dividing_prompt(root: Path, prompt: str, ranks: int, frames: int, height: int, width: int) -> tuple[str, int]:
    """`prompt`, lengthened a word at a time until the packed sequence divides by `ranks`; (prompt, rows)."""
    from machine.device import DeviceInfo
    from machine.offload import OffloadSettings
    from models.forecast import forecast_generate
    from models.request.params import GenerateParams

    cpu = DeviceInfo("cpu", "cpu", None, "cpu", True, None, "bench", "")
    for extra in range(4 * ranks):
        text = prompt + " very" * extra
        params = GenerateParams(prompt=text, frames=frames, height=height, width=width, audio=False)
        rows = forecast_generate(root, params, device_info=cpu, settings=OffloadSettings()).tokens
        if rows % ranks == 0:
            return text, rows
    raise SystemExit(f"no prompt within {4 * ranks} extra words gives a sequence dividing by {ranks}")


def run(root: Path, args, ranks: int, prompt: str, out: Path) -> dict:
    """One generate in a fresh process; its GenerateResult dict with the wall seconds beside it."""
    cmd = [sys.executable, "-m", "models", "generate", str(root), "--prompt", prompt, "--out", str(out),
           "--device", args.device, "--frames", str(args.frames), "--height", str(args.height), "--width",
           str(args.width), "--steps", str(args.steps), "--no-audio", "--sequential-components", "--json",
           "--parallel", str(ranks)]
    env = dict(os.environ)
    if args.fake_accelerator:
        fake = str(ROOT / "tests" / "fake_accelerator")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (fake, env.get("PYTHONPATH")) if p)
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, timeout=args.timeout)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"--parallel {ranks} failed (exit {done.returncode}); its error is above")
    return {**json.loads(done.stdout), "wall_seconds": wall}


def per_step(result: dict) -> float:
    """Seconds of the denoise stage per DiT call."""
    return result["stage_seconds"]["denoise.denoise"] / max(result["steps"], 1)


def rank_peaks(result: dict) -> list[dict[str, int]]:
    """Each rank's stage peaks (one run of one process: its own)."""
    return [r["stage_peaks"] for r in result.get("ranks") or [{"stage_peaks": result["stage_peaks"]}]]


def report(single: dict, parallel: dict, ranks: int) -> list[str]:
    lines = [f"denoise s/step: 1 rank {per_step(single):.3f}, {ranks} ranks {per_step(parallel):.3f},"
             f" ratio {per_step(parallel) / per_step(single):.2f}x (goal <= 0.6x)",
             f"wall: 1 rank {single['wall_seconds']:.1f} s, {ranks} ranks {parallel['wall_seconds']:.1f} s"]
    one = rank_peaks(single)[0]
    for stage in ("load.transformer", "denoise.denoise", "text_encoder", "decode.video"):
        cells = [f"{p[stage] / GIB:.2f}" if stage in p else "-" for p in rank_peaks(parallel)]
        lines.append(f"peak {stage:18s} 1 rank {one.get(stage, 0) / GIB:.2f} GiB | per rank " + " / ".join(cells))
    worst = max(max(p.values()) for p in rank_peaks(parallel))
    lines.append(f"largest per-rank peak {worst / GIB:.2f} GiB against the single run's {max(one.values()) / GIB:.2f}"
                 f" GiB: {worst / max(one.values()):.2f}x (goal <= 1.0x)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h3", help="checkpoint profile (default: h3, zero-weight and sparse)")
    parser.add_argument("--work", type=Path, required=True, help="folder for the checkpoint and the clips")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--frames", type=int, default=124)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--width", type=int, default=1344)
    parser.add_argument("--steps", type=int, default=4, help="N steps make N - 1 DiT calls (default: 4)")
    parser.add_argument("--prompt", default="a red fox running through fresh snow at dawn")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per run")
    parser.add_argument("--fake-accelerator", action="store_true",
                        help="dry run on a CPU: report one accelerator to every process (tests/fake_accelerator)")
    parser.add_argument("--out", type=Path, help="folder for parallel.json")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    root = ensure_checkpoint(args.profile, args.work)
    prompt, rows = dividing_prompt(root, args.prompt, args.ranks, args.frames, args.height, args.width)
    print(f"{args.profile} {args.width}x{args.height}x{args.frames}, {args.steps} steps, packed sequence {rows} rows"
          f" ({rows // args.ranks} per rank)", file=sys.stderr)
    single = run(root, args, 1, prompt, args.work / "single.mp4")
    parallel = run(root, args, args.ranks, prompt, args.work / "parallel.mp4")
    lines = report(single, parallel, args.ranks)
    print("\n".join(lines))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "parallel.json").write_text(json.dumps({
            "profile": args.profile, "device": args.device, "ranks": args.ranks, "rows": rows,
            "geometry": [args.width, args.height, args.frames], "steps": args.steps,
            "single": single, "parallel": parallel, "summary": lines}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
