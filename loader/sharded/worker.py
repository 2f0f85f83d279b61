"""One rank of a sharded load: `load_sharded` in a process group, and the torchrun entry point.

`python -m torch.distributed.run --nproc-per-node N -m loader.sharded.worker PATH --out DIR`
runs it on N ranks (gloo on CPU, NCCL on CUDA with rank r on `cuda:LOCAL_RANK`).
Rank 0 writes the aggregate report to `DIR/report.json`; a rank that fails
with an expected error writes `DIR/rank-R.error.json` instead of a traceback.
With `--samples` each rank appends one JSON line per placed tensor to
`DIR/rank-R.samples.jsonl` (flushed per line) for a parent to follow live.
Reports travel between ranks as JSON bytes in tensors, never pickled.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..api import load_checkpoint
from ..options import LoadOptions
from core.errors import DrainboardError
from machine.memory import MemoryProbe
from ..naming import MergeRules, RenameRules
from ..process import configure_process
from ..report import TensorPlaced
from .placement import ShardedPlacement
from .report import RankReport, ShardedReport

def rank_device(device_type: str) -> torch.device:
    """This rank's device: `cuda:LOCAL_RANK` (made current) for CUDA, else the CPU."""
    if device_type == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def load_sharded(
    path: str | os.PathLike,
    mesh: DeviceMesh,
    *,
    component: str | None = None,
    module: nn.Module | None = None,
    dtype: str | torch.dtype | None = None,
    rename: RenameRules = None,
    merges: MergeRules = None,
    strict: bool = True,
    fsdp: bool = True,
    shard_modules: str | None = None,
    on_tensor: Callable[[TensorPlaced], None] | None = None,
    probe: MemoryProbe | None = None,
    **stream_options,
) -> tuple[nn.Module, RankReport, ShardedPlacement]:
    """Load this rank's shards of `path` onto the mesh's device; every rank of `mesh` must call it.

    Goes through `load_checkpoint` (discovery, validation, skeleton or
    registered model, dtype policy, metrics) with a `ShardedPlacement`.
    Returns the module (FSDP-wrapped with `fsdp`), this rank's report and the
    placement (its `units` name the FSDP units).
    """
    device = torch.device(mesh.device_type, torch.cuda.current_device()) if mesh.device_type == "cuda" else torch.device("cpu")
    placement = ShardedPlacement(mesh=mesh, fsdp=fsdp, shard_modules=shard_modules, **stream_options)
    module, report = load_checkpoint(
        path,
        LoadOptions(component=component, mode=placement, device=device, dtype=dtype, rename=rename, merges=merges,
                    strict=strict),
        module=module, on_tensor=on_tensor, probe=probe,
    )
    return module, RankReport(dist.get_rank(), str(device), report, placement.share_bytes, placement.phases), placement


def gather_report(mine: RankReport, mesh: DeviceMesh, checkpoint_bytes: int, fsdp_units: int) -> ShardedReport | None:
    """Every rank's report, aggregated on rank 0 (None elsewhere)."""
    texts = _all_gather_text(json.dumps(mine.to_dict()), mesh)
    if dist.get_rank() != 0:
        return None
    return ShardedReport.aggregate([RankReport.from_dict(json.loads(t)) for t in texts], checkpoint_bytes, fsdp_units)


def _all_gather_text(text: str, mesh: DeviceMesh) -> list[str]:
    """all_gather of one string per rank as UTF-8 bytes in tensors (works on gloo and NCCL)."""
    device = torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda" else torch.device("cpu")
    group = mesh.get_group()
    data = torch.tensor(list(text.encode()), dtype=torch.uint8, device=device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(mesh.size())]
    dist.all_gather(sizes, torch.tensor([data.numel()], dtype=torch.int64, device=device), group=group)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: data.numel()] = data
    outs = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in sizes]
    dist.all_gather(outs, padded, group=group)
    return [bytes(o[: int(s.item())].cpu().tolist()).decode() for o, s in zip(outs, sizes)]


class _SampleLog:
    """Appends one JSON line per placed tensor to this rank's samples file, flushed per line."""

    def __init__(self, path: Path, rank: int):
        self._file = open(path, "a", buffering=1)
        self._rank = rank

    def __call__(self, event: TensorPlaced) -> None:
        record = {
            "rank": self._rank, "index": event.index, "total": event.total, "name": event.name,
            "nbytes": event.nbytes, "bytes_placed": event.bytes_placed, "sample": event.sample.to_dict(),
        }
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._file.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loader.sharded.worker", description="one rank of a sharded load")
    parser.add_argument("path", help="model folder, component folder or .safetensors file")
    parser.add_argument("--out", required=True, type=Path, help="folder for report.json, errors and samples")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cpu (gloo) or cuda (NCCL)")
    parser.add_argument("--component", help="component of a model folder")
    parser.add_argument("--dtype", help="target dtype, e.g. bf16 (default: the checkpoint's)")
    parser.add_argument("--no-strict", dest="strict", action="store_false", help="allow missing/unexpected tensors")
    parser.add_argument("--no-fsdp", dest="fsdp", action="store_false", help="leave plain DTensor shards, no fully_shard")
    parser.add_argument("--shard-modules", help="regex of module names wrapped as FSDP units")
    parser.add_argument("--samples", action="store_true", help="write rank-R.samples.jsonl, one line per tensor")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_process(args.device)
    start = time.perf_counter()
    device = rank_device(args.device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda" else None)
    rank = dist.get_rank()
    log = _SampleLog(args.out / f"rank-{rank}.samples.jsonl", rank) if args.samples else None
    try:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        group_seconds = time.perf_counter() - start
        try:
            _, mine, placement = load_sharded(
                args.path, mesh, component=args.component, dtype=args.dtype, strict=args.strict, fsdp=args.fsdp,
                shard_modules=args.shard_modules, on_tensor=log,
            )
        except DrainboardError as exc:
            problems = list(getattr(exc, "problems", None) or [str(exc)])
            error = {"ok": False, "rank": rank, "error": "; ".join(problems), "errors": problems}
            (args.out / f"rank-{rank}.error.json").write_text(json.dumps(error))
            print(f"rank {rank}: error: {error['error']}", file=sys.stderr)
            return 2
        mine.phases.group = group_seconds
        aggregate = gather_report(mine, mesh, placement.checkpoint_bytes, len(placement.units))
        if aggregate is not None:
            (args.out / "report.json").write_text(json.dumps(aggregate.to_dict()))
        dist.barrier()  # every rank leaves the group together, after rank 0 has written the report
        return 0
    finally:
        if log is not None:
            log.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    from machine.lifetime import exit_rank

    exit_rank(main)
