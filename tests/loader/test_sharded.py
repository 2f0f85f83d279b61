"""Sharded loading on CPU with gloo: each rank reads and holds only its own dim-0 slices.

Ranks run under `torch.multiprocessing.spawn` (worlds of 2 and 3, the latter
uneven with empty shares); a failed assertion in any rank fails the test
with that rank's traceback. Bytes read are counted at the syscall
(`os.preadv`) in each rank and compared range by range with the slices the
rank owns.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from safetensors.torch import load_file
from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

from core import CheckpointError, PlacementError
from core.errors import DrainboardError
from loader import load_checkpoint
from loader.checkpoint import discover_checkpoint
from loader.naming import MergeRule, Target
from loader.placement import PlannedTarget
from loader.sharded import ShardedPlacement, local_target, shard_rows, wrap_fully_shard
from loader.cli import main as cli_main
from loader.sharded.launch import format_sharded, launch_sharded


def uneven_shards(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Two shards whose dim-0 sizes split unevenly over 2 and 3 ranks (random, never zeros):
    1. block 0: q/k/v projections 5 x 6 (fp32), a norm of 2 (bf16: rank 2 of 3 gets nothing);
    2. block 1: ff 7 x 6 (fp32) and bias 7, `proj_out` 4 x 7 (fp32), an int64 table of 1 row.
    """
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) + 0.5).to(dtype)

    return [
        {
            "blocks.0.to_q.weight": rand(5, 6),
            "blocks.0.to_k.weight": rand(5, 6),
            "blocks.0.to_v.weight": rand(5, 6),
            "blocks.0.norm.weight": rand(2, dtype=torch.bfloat16),
        },
        {
            "blocks.1.ff.weight": rand(7, 6),
            "blocks.1.ff.bias": rand(7),
            "proj_out.weight": rand(4, 7),
            "table": torch.randint(1, 1000, (1, 3), generator=g),
        },
    ]


class TinyDiT(nn.Module):
    """Just enough model to run a forward through FSDP units: two blocks and an output projection."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(6, 6), nn.Linear(6, 6)])
        self.proj_out = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.proj_out(x)


def tiny_dit_shards(seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """TinyDiT's weights (random) in two shards: the blocks, then the output projection."""
    torch.manual_seed(seed)
    state = {k: v + 0.5 for k, v in TinyDiT().state_dict().items()}
    return [{k: v for k, v in state.items() if k.startswith("blocks.")},
            {k: v for k, v in state.items() if not k.startswith("blocks.")}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _count_preadv(log: list[tuple[str, int, int]]) -> None:
    """Record (file, offset, bytes) of every positioned read this process makes."""
    real = os.preadv

    def counting(fd, buffers, offset, *rest):
        n = real(fd, buffers, offset, *rest)
        log.append((os.readlink(f"/proc/self/fd/{fd}"), offset, n))
        return n

    os.preadv = counting


def _merged(ranges: list[tuple[str, int, int]]) -> dict[str, list[tuple[int, int]]]:
    """(file, start, length) ranges as sorted, coalesced [start, end) intervals per file."""
    out: dict[str, list[tuple[int, int]]] = {}
    for file, start, length in sorted(ranges):
        if length == 0:
            continue
        spans = out.setdefault(file, [])
        if spans and spans[-1][1] == start:
            spans[-1] = (spans[-1][0], start + length)
        else:
            spans.append((start, start + length))
    return out


def _expected_ranges(path: Path, rank: int, world: int) -> list[tuple[str, int, int]]:
    """The byte ranges `rank` owns: its rows of every tensor, from the headers."""
    out = []
    for meta in discover_checkpoint(path).component().tensors:
        start, stop = shard_rows(meta.shape[0], rank, world)
        row = meta.nbytes // meta.shape[0]
        out.append((str(meta.file.resolve()), meta.offset + start * row, (stop - start) * row))
    return out


def _rank_checks_slices_bytes_and_gather(rank: int, world: int, port: int, path: str, dit_path: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from loader.sharded.worker import load_sharded

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        source = {k: v for f in sorted(Path(path).glob("*.safetensors")) for k, v in load_file(f).items()}
        reads: list[tuple[str, int, int]] = []
        _count_preadv(reads)
        module, mine, placement = load_sharded(path, mesh, threads=2)

        # Only this rank's bytes, each once.
        expected = _expected_ranges(Path(path), rank, world)
        assert _merged(reads) == _merged(expected), f"rank {rank} read other bytes"
        assert sum(n for _, _, n in reads) == sum(n for _, _, n in expected) == mine.report.bytes_read
        assert mine.share_bytes == mine.report.bytes_read

        # Every shard is the matching slice, bit for bit; the gathered tensor is the source.
        state = module.state_dict()
        assert sorted(state) == sorted(source)
        for name, full in source.items():
            shard = state[name]
            assert isinstance(shard, DTensor) and shard.placements == (Shard(0),), name
            assert shard.shape == full.shape and shard.dtype == full.dtype, name
            start, stop = shard_rows(full.shape[0], rank, world)
            local = shard.to_local()
            assert local.shape == full[start:stop].shape, name
            assert torch.equal(local.view(torch.uint8), full[start:stop].contiguous().view(torch.uint8)), name
            assert torch.equal(shard.full_tensor().view(torch.uint8), full.view(torch.uint8)), name
        assert mine.report.bytes_placed == sum(t.to_local().nbytes for t in state.values())
        assert placement.units == ["blocks.0", "blocks.1", ""]

        # A merged target is sharded over the concatenation: this rank's rows of cat(q, k, v).
        merge = [MergeRule(r"\1.qkv.weight", tuple(rf"(.+)\.to_{p}\.weight" for p in "qkv"))]
        fused_module, _, _ = load_sharded(path, mesh, merges=merge, fsdp=False)
        qkv = torch.cat([source[f"blocks.0.to_{p}.weight"] for p in "qkv"])
        start, stop = shard_rows(qkv.shape[0], rank, world)
        assert torch.equal(fused_module.state_dict()["blocks.0.qkv.weight"].to_local(), qkv[start:stop])

        # fully_shard took the parameters as placed: a forward through the FSDP units matches one unsharded load.
        with torch.device("meta"):
            meta_model = TinyDiT()
        sharded, _, _ = load_sharded(dit_path, mesh, module=meta_model)
        reference, _ = load_checkpoint(dit_path, module=TinyDiT())
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            assert torch.equal(sharded(x), reference(x))
    finally:
        dist.destroy_process_group()


@pytest.fixture
def uneven_checkpoint(component_writer) -> Path:
    """Component folder `uneven/` with the two shards of `uneven_shards`."""
    return component_writer(uneven_shards(), name="uneven")


@pytest.fixture
def tiny_dit_checkpoint(component_writer) -> Path:
    """Component folder `dit/` holding TinyDiT's weights in two shards."""
    return component_writer(tiny_dit_shards(), name="dit")


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_each_rank_reads_only_its_slices_and_fully_shard_runs_the_model(uneven_checkpoint, tiny_dit_checkpoint, world):
    mp.spawn(
        _rank_checks_slices_bytes_and_gather,
        args=(world, free_port(), str(uneven_checkpoint), str(tiny_dit_checkpoint)),
        nprocs=world,
    )


@pytest.mark.parametrize("rows", [0, 1, 2, 3, 4, 5, 7, 8, 16, 33])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_shard_rows_splits_like_fsdp2(rows, world):
    chunks = _chunk_with_empty(torch.empty(rows, 2), world, dim=0)
    starts = [0]
    for c in chunks:
        starts.append(starts[-1] + c.shape[0])
    assert [shard_rows(rows, r, world) for r in range(world)] == [
        (min(starts[r], rows), min(starts[r], rows) + chunks[r].shape[0]) for r in range(world)
    ]


def test_local_target_of_a_merged_tensor_cuts_rows_from_each_source_it_spans(uneven_checkpoint):
    metas = {m.name: m for m in discover_checkpoint(uneven_checkpoint).component().tensors}
    q, k, v = (metas[f"blocks.0.to_{p}.weight"] for p in "qkv")
    fused = PlannedTarget(Target("blocks.0.qkv.weight", (q, k, v), (15, 6)), torch.float32)
    # 15 rows over 2 ranks: rank 0 rows 0-7 (q 0-4, k 0-2), rank 1 rows 8-14 (k 3-4, v 0-4).
    first, second = local_target(fused, 0, 2), local_target(fused, 1, 2)
    assert first.target.shape == (8, 6) and second.target.shape == (7, 6)
    assert [(s.name, s.shape[0]) for s in first.sources] == [(q.name, 5), (k.name, 3)]
    assert [(s.name, s.shape[0]) for s in second.sources] == [(k.name, 2), (v.name, 5)]
    row = 6 * 4
    assert first.sources[1].data_offsets == (k.data_offsets[0], k.data_offsets[0] + 3 * row)
    assert second.sources[0].data_offsets == (k.data_offsets[0] + 3 * row, k.data_offsets[1])
    assert local_target(fused, 2, 3).sources[-1].data_offsets[1] == v.data_offsets[1]


@pytest.mark.slow
def test_launcher_aggregates_every_rank_and_follows_their_samples_live(uneven_checkpoint):
    seen: dict[int, list[str]] = {}
    result = launch_sharded(uneven_checkpoint, 2, on_tensor=lambda rank, e: seen.setdefault(rank, []).append(e.name))
    aggregate, ranks = result["aggregate"], result["ranks"]
    total = sum(t.nbytes for s in uneven_shards() for t in s.values())
    assert aggregate["world_size"] == 2 and [r["rank"] for r in ranks] == [0, 1]
    assert aggregate["checkpoint_bytes"] == aggregate["bytes_read"] == total
    assert aggregate["read_amplification"] == 1.0
    assert [r["bytes_read"] for r in ranks] == [sum(n for _, _, n in _expected_ranges(uneven_checkpoint, r, 2)) for r in range(2)]
    assert aggregate["bytes_placed"] == sum(r["bytes_placed"] for r in ranks) == total
    assert aggregate["load_seconds"] == max(r["load_seconds"] for r in ranks) > 0
    assert aggregate["footprint_ratio"] == max(r["footprint_ratio"] for r in ranks)
    assert aggregate["fsdp_units"] == 3
    assert sorted(seen) == [0, 1]
    assert sorted(seen[0]) == sorted(seen[1]) == sorted(k for s in uneven_shards() for k in s)
    lines = format_sharded(result).splitlines()
    assert lines[0].startswith("sharded over 2 ranks: 8 tensors") and len(lines) == 6
    assert lines[3].startswith("    before the load: group ") and "| load: allocate " in lines[3]


@pytest.mark.slow
def test_load_seconds_is_the_sum_of_the_load_phases_and_leaves_set_up_out(uneven_checkpoint):
    ranks = launch_sharded(uneven_checkpoint, 2)["ranks"]
    for r in ranks:
        phases = r["phases"]
        assert phases["group"] > 0 and phases["setup"] > 0, phases
        in_load = phases["allocate"] + phases["read"] + phases["assign"] + phases["sync"]
        assert min(phases["allocate"], phases["read"], phases["assign"]) > 0, phases
        assert 0 <= r["load_seconds"] - in_load < 0.05, (r["load_seconds"], phases)


def test_cli_load_with_nproc_goes_to_the_sharded_launcher(capsys):
    assert cli_main(["load", "/nonexistent", "--nproc", "2", "--device", "mps", "--json"]) == 2
    error = json.loads(capsys.readouterr().out)
    assert error["ok"] is False and "sharded loads run on device 'cpu' or 'cuda'" in error["error"]


def test_a_rank_that_dies_after_the_report_is_written_is_said_as_such(uneven_checkpoint, monkeypatch):
    import subprocess
    import sys

    import loader.sharded.launch as launch

    popen = subprocess.Popen

    def torchrun_whose_rank_dies_ending(cmd, **kwargs):  # rank 0 wrote the report, then a rank aborted
        out = Path(cmd[cmd.index("--out") + 1])
        (out / "report.json").write_text("{}")
        return popen([sys.executable, "-c", "raise SystemExit(1)"])

    monkeypatch.setattr(launch.subprocess, "Popen", torchrun_whose_rank_dies_ending)
    with pytest.raises(DrainboardError, match=r"on 2 ranks finished, but a rank died as it ended \(torchrun exit 1\)"):
        launch_sharded(uneven_checkpoint, 2)


def test_launcher_rejects_a_malformed_checkpoint_before_starting_ranks(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05")
    with pytest.raises(CheckpointError, match="bad.safetensors"):
        launch_sharded(bad, 2)


def test_sharded_placement_names_what_it_needs_when_the_mesh_is_missing():
    with pytest.raises(PlacementError, match="needs a 1-D DeviceMesh as mesh="):
        ShardedPlacement(mesh=None)
    with pytest.raises(PlacementError, match="does not take option.*staging"):
        ShardedPlacement(mesh=None, staging=1)


def test_fully_shard_wrapping_refuses_a_scalar_parameter_by_name():
    module = nn.Module()
    module.scale = nn.Parameter(torch.tensor(2.0, device="meta"))
    with pytest.raises(PlacementError, match="0-d parameter\\(s\\) scale"):
        wrap_fully_shard(module, mesh=None)
