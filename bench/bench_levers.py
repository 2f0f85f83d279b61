"""The engine's speed levers side by side, one run each, on one GPU at real size (not a test).

On one H200 (diffusers and av as wheels in .whl/, as bench/device_generate.sh installs them):

    python bench/bench_levers.py --work .levers --device cuda --budget 540 --out "$OUT"
    python bench/bench_levers.py --work .levers --device cuda --budget 540 --out "$OUT" --resume  # the rest

A dry run of the harness on a CPU (the tiny profile, seconds per case; compile there takes minutes):

    python bench/bench_levers.py --profile tiny --work /tmp/levers --device cpu --steps 3 --cache-steps 6 \
        --cases exact,exact-repeat,_native_flash,taylorseer@cache,exact@cache

1. Checkpoint: `--root`, or the profile written under `--work` (`h3`: headers with holes, so zero weights,
   `bench/check_forecast_cuda.write_sparse_h3`; `tiny`/`demo`: random weights, `python -m models synth`).
2. Cases, each in a fresh process, t2va at `--canvas` (default: the checkpoint's), `--frames` (124), `--steps` (8;
   `@cache` cases `--cache-steps`, 20, as a step cache needs steps to reuse), seed 0, sequential residency, every
   offload flag off: `exact`, `exact-repeat` (the tolerance: the same run twice), each attention backend the
   device runs, `compile`, `fp8-compute`, `taylorseer@cache` against `exact@cache`; then `best-lossless` (the
   fastest lossless backend with compile) and `best` (that with fp8 compute and TaylorSeer, `@cache`); last,
   `vae-compile` (the VAE decoder's blocks compiled), against `exact`.
3. Per case: s/step (denoise.denoise over its DiT calls, a compiled DiT's compiling calls left out), those
   calls' cost (`denoise.compile`), each stage's peak (VmRSS + CUDA allocated, `GenerateResult.stage_peaks`),
   total seconds, the decode's seconds (`decode.video`, a compiled decoder's first call apart: `decode.compile`),
   and PSNR / SSIM of its MP4's frames against its baseline's (Compare's own A/B metrics,
   `dashboard.views.ab`; `exact-repeat` against `exact` is the floor any lossless lever is held to), and the stage
   whose forecast (of the same request, under the settings the run resolved) is furthest from its measured peak
   (`bench/compare_forecast.py`).
Prints the table with each case's s/step over its baseline's and the goals (best lossless <= 0.85x, best
<= 0.5x; a missed goal says by how much), and writes `levers.json` to `--out`. On zero weights every run's
frames may agree exactly, so PSNR there says only whether a lever changed the arithmetic.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loader.process import configure_process  # noqa: E402

configure_process()  # an entry point: the hub offline, the mmap threshold fixed, as a job child

LOSSLESS_GOAL, LOSSY_GOAL = 0.85, 0.5
"""s/step over the exact run's: the best lossless set's goal and the best set's."""
BACKENDS = ("_native_cudnn", "_native_flash", "_native_efficient", "sage")
CASES = ("exact", "exact-repeat", *BACKENDS, "compile", "fp8-compute", "exact@cache", "taylorseer@cache",
         "best-lossless", "best@cache", "vae-compile")
PROMPT = "a red fox running through fresh snow at dawn"


def case_levers(case: str, best_backend: str) -> dict:
    """The GenerateParams lever fields of `case` (`@cache` names the step count, not a lever)."""
    name = case.removesuffix("@cache")
    if name in ("exact", "exact-repeat"):
        return {}
    if name in BACKENDS:
        return {"attention": name}
    if name == "compile":
        return {"compile": True}
    if name == "fp8-compute":
        return {"quantize": "fp8-compute"}
    if name == "taylorseer":
        return {"step_cache": "taylorseer"}
    if name == "best-lossless":
        return {"attention": best_backend, "compile": True}
    if name == "best":
        return {"attention": best_backend, "compile": True, "quantize": "fp8-compute", "step_cache": "taylorseer"}
    if name == "vae-compile":
        return {"vae_compile": True}
    raise ValueError(f"unknown case {case!r}; known: {', '.join(CASES)}")


def baseline(case: str) -> str:
    """The run `case` is measured against: the exact run at its own step count (the exact runs are their own)."""
    if case in ("exact", "exact@cache"):
        return case
    return "exact@cache" if case.endswith("@cache") else "exact"


def run_child(spec: dict) -> dict:
    """One case in this process: `run_generate` as `python -m models generate` runs it, its result as a dict."""
    import torch

    from machine.device import probe_device
    from machine.offload import OffloadSettings
    from models.forecast import forecast_generate
    from models.request.params import GenerateParams
    from models.run.pipeline import run_generate

    params = GenerateParams(prompt=PROMPT, frames=spec["frames"], height=spec.get("height"), width=spec.get("width"),
                            steps=spec["steps"], seed=0, **spec["levers"])
    off = OffloadSettings(**{name: False for name in OffloadSettings().to_dict()})
    started = time.monotonic()
    configure_process(spec["device"])  # the device's settings, before anything pins
    result = run_generate(spec["root"], params, spec["mp4"], device=spec["device"], offload=off,
                          sequential_components=True)
    if spec["device"].startswith("cuda"):
        torch.cuda.synchronize()
    total = time.monotonic() - started
    # after the run, so that its reads stay out of the run's peaks; under the settings the run resolved
    forecast = forecast_generate(spec["root"], params, device_info=probe_device(spec["device"]),
                                 settings=OffloadSettings(**result.offload), sequential_components=True, resolved=True)
    stages = [{"stage": s.stage, "sum_bytes": s.total_bytes} for s in forecast.stages]
    return {**result.to_dict(), "total_seconds": total,
            "forecast": {"process_host_bytes": forecast.process_host_bytes, "stages": stages}}


def problem(case: str, levers: dict, device: str) -> str | None:
    """Why the device cannot run `case` (the product's own check), or None."""
    from models.speed.levers import lever_problems
    from models.quantization.check import cuda_capability
    from machine.device import parse_device_spec

    return next(iter(lever_problems(levers, device, cuda_capability(*parse_device_spec(device))).values()), None)


def seconds_per_step(result: dict) -> float | None:
    """The Job page's s/step of a finished run (`dashboard.views.cards`: a compiled DiT's compiling calls left out)."""
    from dashboard.views.cards import seconds_per_step as per_step

    return per_step({"progress_done": result.get("steps"), "metrics": result}, None, 0.0)


def frames_against(mp4: Path, reference: Path) -> dict:
    from dashboard.views.ab import frame_diff, read_frames

    diff = frame_diff(read_frames(reference), read_frames(mp4))
    finite = [p for p in diff.psnr if math.isfinite(p)]
    return {"psnr_min": min(finite) if finite else math.inf, "psnr_mean": sum(finite) / len(finite) if finite
            else math.inf, "ssim_min": min(diff.ssim), "identical_frames": len(diff.psnr) - len(finite)}


def checkpoint(args) -> Path:
    if args.root:
        return Path(args.root)
    root = Path(args.work) / args.profile
    if (root / "modular_model_index.json").is_file():
        return root
    if args.profile == "h3":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from check_forecast_cuda import write_sparse_h3

        write_sparse_h3(root, "h3")  # every folder the run reads, tokenizer and schedulers too
    else:
        subprocess.run([sys.executable, "-m", "models", "synth", str(root), "--profile", args.profile], check=True,
                       cwd=Path(__file__).resolve().parents[1])
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--root", help="an H3 checkpoint (default: the profile written under --work)")
    parser.add_argument("--profile", default="h3", choices=("h3", "demo", "tiny"))
    parser.add_argument("--work", default=".levers", help="checkpoint, MP4s and per-case results")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--frames", type=int, default=124)
    parser.add_argument("--canvas", help="HEIGHTxWIDTH (default: the checkpoint's default canvas)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--cache-steps", type=int, default=20)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--budget", type=float, default=540.0, help="seconds: no case starts past it")
    parser.add_argument("--resume", action="store_true", help="keep the cases --work/results already holds")
    parser.add_argument("--out", default=".", help="where levers.json goes")
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        Path(spec["result"]).write_text(json.dumps(run_child(spec)))
        return 0
    started = time.monotonic()
    root = checkpoint(args)
    work = Path(args.work)
    (work / "results").mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    if args.resume:
        for path in (work / "results").glob("*.json"):
            results[path.stem] = json.loads(path.read_text())
    for case in args.cases.split(","):
        if case in results:
            continue
        lossless = [b for b in BACKENDS if b in results and "error" not in results[b] and b != "sage"]
        best = min(lossless, key=lambda b: seconds_per_step(results[b]) or math.inf, default="native")
        levers = case_levers(case, best)
        refused = problem(case, levers, args.device)
        if refused:
            results[case] = {"error": refused}
            print(f"{case}: skipped: {refused}", flush=True)
            continue
        if time.monotonic() - started > args.budget:
            print(f"{case}: not started, the --budget of {args.budget:.0f} s is spent (run again with --resume)")
            continue
        steps = args.cache_steps if case.endswith("@cache") else args.steps
        height, width = map(int, args.canvas.split("x")) if args.canvas else (None, None)
        spec = {"root": str(root), "device": args.device, "frames": args.frames, "height": height, "width": width,
                "steps": steps, "levers": levers,
                "mp4": str(work / f"{case}.mp4"), "result": str(work / "results" / f"{case}.json")}
        print(f"{case}: {levers or 'no lever'}, {steps} steps", flush=True)
        child = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], text=True,
                               capture_output=True)
        if child.returncode != 0:
            results[case] = {"error": (child.stderr.strip().splitlines() or ["no output"])[-1]}
            Path(spec["result"]).write_text(json.dumps(results[case]))
        else:
            results[case] = json.loads(Path(spec["result"]).read_text())
        print(f"  {results[case].get('error') or 'done'}", flush=True)
    rows = table(results, work)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "levers.json").write_text(json.dumps({"device": args.device, "root": str(root),
                                                            "frames": args.frames, "canvas": args.canvas, "steps": args.steps,
                                                            "cache_steps": args.cache_steps, "rows": rows}, indent=2))
    return 0


def table(results: dict[str, dict], work: Path) -> list[dict]:
    """One row per case against its baseline, printed, with the goals."""
    from compare_forecast import compare  # bench/, this script's folder

    rows = []
    print(f"{'case':<20}{'s/step':>9}{'x base':>8}{'first call s':>14}{'peak GiB':>10}{'total s':>9}"
          f"{'PSNR min':>10}{'SSIM min':>10}{'decode s':>10}{'decode 1st s':>14}{'forecast worst':>24}")
    for case, result in results.items():
        if "error" in result:
            rows.append({"case": case, "error": result["error"]})
            print(f"{case:<20} {result['error']}")
            continue
        base = results.get(baseline(case), {})
        per, base_per = seconds_per_step(result), seconds_per_step(base) if "error" not in base else None
        ratio = per / base_per if per and base_per else None
        against = frames_against(work / f"{case}.mp4", work / f"{baseline(case)}.mp4") \
            if case != baseline(case) and (work / f"{baseline(case)}.mp4").is_file() else {}
        row = {"case": case, "s_per_step": per, "ratio": ratio,
               "first_call_seconds": result["stage_seconds"].get("denoise.compile"),
               "decode_seconds": result["stage_seconds"].get("decode.video"),
               "decode_first_call_seconds": result["stage_seconds"].get("decode.compile"),
               "stage_peaks": result["stage_peaks"], "peak": max(result["stage_peaks"].values()),
               "total_seconds": result["total_seconds"], **against}
        checked = compare(result["forecast"], result) if "forecast" in result else []
        worst = max(checked, key=lambda r: abs(r["ratio"] - 1), default=None)
        row["forecast_worst"] = worst and {"stage": worst["stage"], "ratio": worst["ratio"]}
        worst_stage, worst_ratio = (worst["stage"], _num(worst["ratio"], 3)) if worst else ("", "")
        rows.append(row)
        print(f"{case:<20}{_num(per, 3):>9}{_num(ratio, 3):>8}{_num(row['first_call_seconds'], 1):>14}"
              f"{row['peak'] / 2**30:>10.2f}{row['total_seconds']:>9.1f}{_num(against.get('psnr_min'), 1):>10}"
              f"{_num(against.get('ssim_min'), 4):>10}{_num(row['decode_seconds'], 2):>10}"
              f"{_num(row['decode_first_call_seconds'], 1):>14}"
              f"{f'{worst_stage} {worst_ratio}' if worst else '-':>24}")
    for case, goal in (("best-lossless", LOSSLESS_GOAL), ("best@cache", LOSSY_GOAL)):
        ratio = next((r.get("ratio") for r in rows if r["case"] == case), None)
        if ratio is None:
            print(f"goal {case} <= {goal}x: not measured")
        else:
            print(f"goal {case} <= {goal}x: {ratio:.3f}x, " + ("met" if ratio <= goal else
                                                               f"missed by {ratio - goal:.3f}x"))
    return rows


def _num(value, digits: int) -> str:
    return "-" if value is None else "inf" if value == math.inf else f"{value:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
