"""Start a sharded load on N local ranks through torchrun and collect the aggregate report.

The parent checks the checkpoint and the device count before starting
anything, runs `python -m torch.distributed.run --standalone` (a free
rendezvous port) with `loader.sharded.worker`, sends the ranks' own output to
stderr, and, when asked, follows each rank's samples file so a caller (the
job runner) can record one curve per rank while the load runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from ..checkpoint import discover_checkpoint
from ..dtypes import parse_dtype
from core.errors import DeviceError, DrainboardError, PlacementError
from machine.memory import MemorySample
from ..report import TensorPlaced

RankTensorCallback = Callable[[int, TensorPlaced], None]
"""Called in the parent with (rank, event) for every tensor a rank placed."""

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""NVLink multicast stays off (the device docs require it); set unless the caller set them."""


class RankLineFollower:
    """Reads the new complete JSON lines of one file per rank (written by the ranks as they go) and hands each
    to `on_line(rank, object)`; a file not written yet is skipped."""

    def __init__(self, paths: list[Path], on_line: Callable[[int, dict], None]):
        self._paths = paths
        self._offsets = [0] * len(paths)
        self._on_line = on_line

    def poll(self) -> None:
        for rank, path in enumerate(self._paths):
            if not path.exists():
                continue
            with open(path, "rb") as f:
                f.seek(self._offsets[rank])
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self._offsets[rank] += len(complete)
            for line in complete.splitlines():
                self._on_line(rank, json.loads(line))


def _sample_follower(folder: Path, nproc: int, on_tensor: RankTensorCallback) -> RankLineFollower:
    """Replays every `rank-R.samples.jsonl` in `folder` as (rank, TensorPlaced)."""
    def replay(rank: int, d: dict) -> None:
        on_tensor(rank, TensorPlaced(d["index"], d["total"], d["name"], d["nbytes"], d["bytes_placed"],
                                     MemorySample(**d["sample"])))

    return RankLineFollower([folder / f"rank-{r}.samples.jsonl" for r in range(nproc)], replay)


def launch_sharded(
    path: str | os.PathLike,
    nproc: int,
    *,
    device: str = "cpu",
    component: str | None = None,
    dtype: str | None = None,
    strict: bool = True,
    fsdp: bool = True,
    shard_modules: str | None = None,
    on_tensor: RankTensorCallback | None = None,
    poll_seconds: float = 0.2,
) -> dict:
    """Load `path` sharded over `nproc` local ranks; returns `{"aggregate": {...}, "ranks": [...]}`.

    `device` is `cpu` (gloo) or `cuda` (NCCL, one GPU per rank). Raises
    CheckpointError before starting anything when the checkpoint is
    malformed, PlacementError for an unknown dtype, DeviceError when there
    are fewer GPUs than ranks, and the
    ranks' own errors (one line each) when they fail.
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise PlacementError(f"nproc must be a positive integer, got {nproc!r}")
    if device not in ("cpu", "cuda"):
        raise DeviceError(f"sharded loads run on device 'cpu' or 'cuda' (one GPU per rank), got {device!r}")
    if device == "cuda" and torch.cuda.device_count() < nproc:
        raise DeviceError(f"{nproc} ranks need {nproc} CUDA devices; this machine has {torch.cuda.device_count()}")
    parse_dtype(dtype)
    discover_checkpoint(path)
    with tempfile.TemporaryDirectory(prefix="drainboard-sharded-") as tmp:
        out = Path(tmp)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "loader.sharded.worker", str(path), "--out", str(out), "--device", device]
        cmd += ["--component", component] if component else []
        cmd += ["--dtype", dtype] if dtype else []
        cmd += [] if strict else ["--no-strict"]
        cmd += [] if fsdp else ["--no-fsdp"]
        cmd += ["--shard-modules", shard_modules] if shard_modules else []
        cmd += ["--samples"] if on_tensor is not None else []
        env = {**NCCL_ENV, **os.environ}
        env.setdefault("OMP_NUM_THREADS", "1")
        package_root = str(Path(__file__).resolve().parents[2])  # the folder holding `loader/`
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        proc = subprocess.Popen(cmd, stdout=2, env=env)
        follower = _sample_follower(out, nproc, on_tensor) if on_tensor is not None else None
        try:
            while proc.poll() is None:
                if follower is not None:
                    follower.poll()
                time.sleep(poll_seconds)
        finally:
            _stop(proc)
        if follower is not None:
            follower.poll()
        report = out / "report.json"
        if proc.returncode == 0 and report.exists():
            return json.loads(report.read_text())
        errors = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.error.json"))]
        if errors:
            raise DrainboardError("; ".join(sorted({e["error"] for e in errors})))
        if report.exists():
            raise DrainboardError(f"sharded load of {path} on {nproc} ranks finished, but a rank died as it ended "
                                  f"(torchrun exit {proc.returncode}); see stderr")
        raise DrainboardError(f"sharded load of {path} on {nproc} ranks failed (torchrun exit {proc.returncode}); see stderr")


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """End torchrun (which ends its ranks) when the caller is interrupted or cancelled mid-load."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_sharded_cli(args: argparse.Namespace) -> int:
    """`python -m loader load PATH --nproc N`: run the ranks, print the aggregate (or `--json`: one object)."""
    device = str(getattr(args, "device", "cpu") or "cpu")
    result = launch_sharded(
        args.path, args.nproc, device=device.split(":")[0], component=getattr(args, "component", None),
        dtype=getattr(args, "dtype", None), strict=getattr(args, "strict", True), fsdp=getattr(args, "fsdp", True),
        shard_modules=getattr(args, "shard_modules", None),
    )
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2))
        return 0
    print(format_sharded(result))
    return 0


def format_sharded(result: dict) -> str:
    """Human lines: the aggregate, then one line per rank."""
    gib = 1024**3
    a = result["aggregate"]
    lines = [
        f"sharded over {a['world_size']} ranks: {a['tensors_total']} tensors, {a['bytes_placed'] / gib:.2f} GiB placed,"
        f" {a['bytes_read'] / gib:.2f} GiB read (x{a['read_amplification']:.3f} of the checkpoint)"
        f" in {a['load_seconds']:.2f} s ({a['throughput_gbps']:.2f} GB/s), {a['fsdp_units']} FSDP units",
        f"footprint_ratio {a['footprint_ratio']:.3f} (worst rank, vs its share)  host_peak_ratio {a['host_peak_ratio']:.3f}"
        f"  memavailable_cost_ratio {a['memavailable_cost_ratio']:.3f}",
    ]
    for r in result["ranks"]:
        lines.append(
            f"  rank {r['rank']} {r['device']}: read {r['bytes_read'] / gib:.2f} GiB, placed {r['bytes_placed'] / gib:.2f} GiB"
            f" in {r['load_seconds']:.2f} s, footprint {r['footprint_ratio']:.3f}, host_peak {r['host_peak_ratio']:.3f},"
            f" device peak {r['peak_device_allocated_bytes'] / gib:.2f} GiB"
        )
        lines.append("    " + format_phases(r.get("phases", {})))
    return "\n".join(lines)


def format_phases(phases: dict) -> str:
    """One line of a rank's phases: set-up outside the load, then what makes up load_seconds."""
    before = "  ".join(f"{k} {phases.get(k, 0.0):.3f}" for k in ("group", "setup"))
    load = "  ".join(f"{k} {phases.get(k, 0.0):.3f}" for k in ("allocate", "read", "assign", "sync"))
    return f"before the load: {before} s | load: {load} s"
