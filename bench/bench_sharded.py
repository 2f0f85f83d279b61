"""Sharded-load benchmark (not a test): one-GPU `stream` against N ranks each reading only its slices.

Writes an H3-shaped bf16 checkpoint (real block shapes, skeleton-loaded) of
at least the requested size, then, per cache state, runs in fresh processes:
`python -m loader load CKPT --device cuda:0` (one GPU, stream) and
`launch_sharded` (what `python -m loader load CKPT --device cuda --nproc N`
runs, followed per tensor). Warm runs read
the files once first; cold runs evict them with posix_fadvise(DONTNEED),
which needs no root. A `verify` pass under torchrun checks every rank's
shards byte for byte against the file and gathers two FSDP units.

    python bench/bench_sharded.py --out /tmp/sharded-bench --size 16 --nproc 2 --diagnose --verify --json $OUT/sharded.json

Each sharded run also reports every rank's phases (process group, set-up, allocate, read, assign,
sync) and its per-tensor timeline; `--diagnose` adds a warm load on one rank and one without FSDP.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torch.distributed.tensor import DTensor  # noqa: E402

from loader.checkpoint import discover_checkpoint  # noqa: E402

GiB = 1 << 30
H3_BLOCK = {  # one transformer block of the full H3 DiT (the release shapes), bf16
    "attn.to_q.weight": (7168, 5376),
    "attn.to_k.weight": (7168, 5376),
    "attn.to_v.weight": (7168, 5376),
    "attn.to_out.0.weight": (5376, 7168),
    "attn.norm_q.weight": (128,),
    "attn.norm_k.weight": (128,),
    "ff.fc_in.weight": (28672, 5376),
    "ff.fc_out.weight": (5376, 14336),
    "adaln_proj.linear.weight": (96768, 16),
}
H3_ROOT = {
    "proj_in.weight": (5376, 96),
    "context_embedder.weight": (5376, 5120),
    "adaln_basis.weight": (16, 2688),
    "bench_odd_rows.weight": (4099, 1024),  # bench-only: an odd row count, so the last rank's shard is short
}


def make_checkpoint(out: Path, size: int, shard_bytes: int = 4 * GiB) -> Path:
    """An H3-shaped bf16 component folder of at least `size` bytes (whole blocks), deterministic, never zeros."""
    from loader.safetensors_file import TensorSpec, plan_shards, write_component

    block_bytes = sum(torch.Size(s).numel() * 2 for s in H3_BLOCK.values())
    blocks = -(-size // block_bytes)
    specs = [TensorSpec(n, s, torch.bfloat16) for n, s in H3_ROOT.items()]
    specs += [TensorSpec(f"transformer_blocks.{b}.{n}", s, torch.bfloat16) for b in range(blocks) for n, s in H3_BLOCK.items()]
    pool = (torch.randn(1 << 26, generator=torch.Generator().manual_seed(0)) + 3.0).to(torch.bfloat16)

    def chunks(spec: TensorSpec):
        shift = (zlib.crc32(spec.name.encode()) & 0xFFFF) * 257
        left = spec.numel
        while left:
            n = min(left, pool.numel() - shift)
            yield pool[shift : shift + n]
            left -= n
            shift = 0

    write_component(out, plan_shards(specs, shard_bytes), chunks, stem="diffusion_pytorch_model")
    (out / "config.json").write_text(json.dumps({"_class_name": "BenchShardedH3", "num_layers": blocks}))
    return out


def _files(path: Path) -> list[Path]:
    return [s.path for s in discover_checkpoint(path).component().shards]


def set_cache(path: Path, cache: str) -> None:
    """`warm`: read every file once; `cold`: evict their pages (posix_fadvise DONTNEED, no root needed)."""
    buf = bytearray(64 << 20)
    for file in _files(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            if cache == "cold":
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            else:
                while os.readv(fd, [buf]):
                    pass
        finally:
            os.close(fd)


def run_load(path: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "loader", "load", str(path), "--json", *extra]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"error": (done.stdout + done.stderr).strip()[-3000:], "wall_seconds": wall}
    result = json.loads(done.stdout)
    result["wall_seconds"] = wall
    return result


def run_sharded(path: Path, nproc: int, device: str, fsdp: bool = True) -> dict:
    """A sharded load through the launcher (fresh torchrun ranks), with every rank's per-tensor timeline."""
    from loader.sharded.launch import launch_sharded

    timeline: dict[int, list[list]] = {}

    def follow(rank: int, event) -> None:
        s = event.sample
        timeline.setdefault(rank, []).append([event.name, event.nbytes, s.t, s.vm_rss, s.device_allocated])

    start = time.perf_counter()
    try:
        result = launch_sharded(path, nproc, device=device, fsdp=fsdp, on_tensor=follow, poll_seconds=0.05)
    except Exception as exc:  # the bench records any failure and goes on with the next run
        return {"error": f"{type(exc).__name__}: {exc}", "wall_seconds": time.perf_counter() - start}
    result["wall_seconds"] = time.perf_counter() - start
    result["timeline"] = {str(r): rows for r, rows in sorted(timeline.items())}
    return result


def timeline_figures(rows: list[list], rank: dict, top: int = 3) -> dict:
    """From one rank's per-tensor samples and its report: time before the first tensor was placed,
    the largest gaps between tensors, and how far above its baseline host memory stood at the first tensor
    (the baseline is the largest sample minus the reported host peak)."""
    if not rows:
        return {}
    span = rows[-1][2] - rows[0][2]
    base_rss = max(r[3] for r in rows) - rank["host_peak_ratio"] * rank["bytes_placed"]
    gaps = sorted(((b[2] - a[2], b[0], b[1]) for a, b in zip(rows, rows[1:])), reverse=True)[:top]
    steps = sorted(((b[3] - a[3], b[0]) for a, b in zip(rows, rows[1:])), reverse=True)[:top]
    return {
        "before_first_tensor_s": rank["load_seconds"] - span,
        "first_tensor": rows[0][0],
        "host_mib_at_first_tensor": (rows[0][3] - base_rss) / (1 << 20),
        "largest_gaps": [{"seconds": g, "tensor": n, "tensor_mib": nb / (1 << 20)} for g, n, nb in gaps],
        "largest_host_steps_mib": [{"mib": d / (1 << 20), "tensor": n} for d, n in steps],
    }


def verify_rank(path: Path, device_type: str) -> None:
    """Under torchrun: every local shard equals its file slice; FSDP gathers block 0 and the root exactly."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from loader.sharded import shard_rows
    from loader.sharded.worker import load_sharded, rank_device

    device = rank_device(device_type)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    module, mine, _ = load_sharded(path, init_device_mesh(device.type, (world,)))
    metas = {m.name: m for m in discover_checkpoint(path).component().tensors}
    for name, shard in module.state_dict().items():
        meta = metas[name]
        start, stop = shard_rows(meta.shape[0], rank, world)
        row = meta.nbytes // meta.shape[0]
        if not torch.equal(_bytes(shard.to_local()), _file_bytes(meta, start * row, (stop - start) * row)):
            raise SystemExit(f"rank {rank}: shard of {name} rows [{start}, {stop}) differs from the file")
    gathered = 0
    for prefix, unit in (("transformer_blocks.0.", module.transformer_blocks.get_submodule("0")), ("", module)):
        unit.unshard()
        for name, param in unit.named_parameters():
            if prefix + name in metas and not isinstance(param, DTensor):
                if not torch.equal(_bytes(param), _file_bytes(metas[prefix + name], 0, metas[prefix + name].nbytes)):
                    raise SystemExit(f"rank {rank}: FSDP-gathered {prefix + name} differs from the file")
                gathered += 1
        unit.reshard()
    print(json.dumps({"rank": rank, "shards_checked": len(metas), "gathered_checked": gathered,
                      "bytes_read": mine.report.bytes_read}), flush=True)
    dist.destroy_process_group()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8).reshape(-1).cpu()


def _file_bytes(meta, start: int, n: int) -> torch.Tensor:
    out = torch.empty(n, dtype=torch.uint8)
    with open(meta.file, "rb") as f:
        f.seek(meta.offset + start)
        f.readinto(memoryview(out.numpy()))
    return out


def summarise(one: dict, sharded: dict, model_bytes: int) -> dict:
    """The figures the issue asks for, from the two reports of one cache state."""
    if "error" in one or "error" in sharded:
        return {"error": one.get("error") or sharded.get("error")}
    agg = sharded["aggregate"]
    ranks = [
        {
            "rank": r["rank"],
            "device_peak_gib": r["peak_device_allocated_bytes"] / GiB,
            "device_peak_of_model": r["peak_device_allocated_bytes"] / model_bytes,
            "device_peak_of_share": r["peak_device_allocated_bytes"] / r["bytes_placed"],
            "host_peak_mib": r["host_peak_ratio"] * r["bytes_placed"] / (1 << 20),
            "read_gib": r["bytes_read"] / GiB,
            "load_seconds": r["load_seconds"],
            "throughput_gbps": r["throughput_gbps"],
            "footprint_ratio": r["footprint_ratio"],
            "phases": r.get("phases", {}),
            "timeline": timeline_figures(sharded.get("timeline", {}).get(str(r["rank"]), []), r),
        }
        for r in sharded["ranks"]
    ]
    return {
        "one_gpu_stream": {k: one[k] for k in ("load_seconds", "throughput_gbps", "footprint_ratio", "host_peak_ratio",
                                               "peak_device_allocated_bytes", "wall_seconds")},
        "sharded": {k: agg[k] for k in ("world_size", "load_seconds", "throughput_gbps", "footprint_ratio",
                                        "host_peak_ratio", "read_amplification", "fsdp_units", "phases")}
        | {"wall_seconds": sharded["wall_seconds"]},
        "speedup": agg["throughput_gbps"] / one["throughput_gbps"] if one["throughput_gbps"] else None,
        "ranks": ranks,
    }


def save(results: dict, path: Path | None) -> None:
    """Write what is known so far, so a run cut short by the device's time limit still leaves its figures."""
    if path is not None:
        path.write_text(json.dumps(results, indent=2))


def phase_table(results: dict) -> str:
    """One line per run and rank: time, rate, where the time went, host memory above baseline, device peak vs share."""
    head = (f"{'run':<18} {'rank':>4} {'load s':>7} {'GB/s':>6} | {'group':>6} {'setup':>6} | {'alloc':>6} {'read':>6}"
            f" {'assign':>6} {'sync':>6} | {'host MiB':>8} {'dev/share':>9} {'before 1st':>10}")
    lines = ["== phases (seconds; group and setup are outside load_seconds)", head]
    for label, run in results["runs"].items():
        summary = run["summary"]
        if "error" in summary:
            lines.append(f"{label:<18} error: {summary['error'][:200]}")
            continue
        if label in ("warm", "cold"):
            one = summary["one_gpu_stream"]
            lines.append(f"{label + ' one-GPU':<18} {'-':>4} {one['load_seconds']:>7.2f} {one['throughput_gbps']:>6.2f}")
        for r in summary["ranks"]:
            ph, tl = r["phases"], r["timeline"]
            lines.append(
                f"{label:<18} {r['rank']:>4} {r['load_seconds']:>7.2f} {r['throughput_gbps']:>6.2f} |"
                f" {ph.get('group', 0):>6.2f} {ph.get('setup', 0):>6.2f} | {ph.get('allocate', 0):>6.2f}"
                f" {ph.get('read', 0):>6.2f} {ph.get('assign', 0):>6.2f} {ph.get('sync', 0):>6.2f} |"
                f" {r['host_peak_mib']:>8.0f} {r['device_peak_of_share']:>9.3f} {tl.get('before_first_tensor_s', 0):>10.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/drainboard-sharded-bench"), help="checkpoint folder")
    parser.add_argument("--size", type=float, default=16.0, help="checkpoint size in GiB (at least)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--cache", nargs="+", default=["warm", "cold"], choices=["warm", "cold"])
    parser.add_argument("--json", type=Path, help="write all results here")
    parser.add_argument("--verify", action="store_true", help="also run the byte-for-byte verify pass")
    parser.add_argument("--diagnose", action="store_true",
                        help="also load warm on 1 rank and on N ranks without FSDP, to tell the phases apart")
    parser.add_argument("--verify-rank", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: gloo ranks, to try the bench here")
    args = parser.parse_args(argv)
    # `timeout` sends SIGTERM: exit through the launcher's `finally`, which stops torchrun and its ranks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.verify_rank:
        verify_rank(args.verify_rank, args.device)
        return 0
    if not (args.out / "config.json").exists():
        t = time.perf_counter()
        make_checkpoint(args.out, int(args.size * GiB))
        print(f"wrote checkpoint in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    component = discover_checkpoint(args.out).component()
    model_bytes = component.total_bytes
    print(f"checkpoint {args.out}: {model_bytes / GiB:.2f} GiB, {component.tensor_count} tensors", file=sys.stderr)
    one_device = "cuda:0" if args.device == "cuda" else "cpu"
    results: dict = {"checkpoint_bytes": model_bytes, "tensors": component.tensor_count, "nproc": args.nproc, "runs": {}}
    for cache in args.cache:
        set_cache(args.out, cache)
        one = run_load(args.out, ["--device", one_device])
        set_cache(args.out, cache)
        sharded = run_sharded(args.out, args.nproc, args.device)
        results["runs"][cache] = {"one_gpu": one, "sharded": sharded, "summary": summarise(one, sharded, model_bytes)}
        print(f"== {cache}\n" + json.dumps(results["runs"][cache]["summary"], indent=2), file=sys.stderr)
        save(results, args.json)
    if args.diagnose:
        # Same code path on one rank (is it the path or two processes at once?), and N ranks without FSDP
        # (is it the per-tensor hand-over to fully_shard?); warm, each against the warm one-GPU load.
        for label, nproc, fsdp in (("sharded_1_rank", 1, True), ("sharded_no_fsdp", args.nproc, False)):
            set_cache(args.out, "warm")
            run = run_sharded(args.out, nproc, args.device, fsdp=fsdp)
            one = results["runs"].get("warm", {}).get("one_gpu") or run_load(args.out, ["--device", one_device])
            results["runs"][label] = {"sharded": run, "summary": summarise(one, run, model_bytes)}
            print(f"== {label} (warm)\n" + json.dumps(results["runs"][label]["summary"], indent=2), file=sys.stderr)
            save(results, args.json)
    if args.verify:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
               __file__, "--verify-rank", str(args.out), "--device", args.device]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
        results["verify"] = {"returncode": done.returncode, "output": (done.stdout + done.stderr)[-4000:]}
        print(f"== verify (exit {done.returncode})\n{done.stdout.strip()}", file=sys.stderr)
    save(results, args.json)
    print(phase_table(results), file=sys.stderr)
    print(json.dumps({c: r["summary"] for c, r in results["runs"].items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
