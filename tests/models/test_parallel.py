"""`--parallel N`: one generate over N local ranks through diffusers' context parallelism: its refusals, its
blocks per rank, its forecast per rank. The runs on 2 gloo ranks (frames against one process, a rank killed) are
the job's: tests/jobs/test_kind_generate_parallel.py.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from core.errors import DeviceError
from models.request.params import GenerateParams, GenerateParamsError, ModelSpec, validate_params

PARALLEL = GenerateParams(prompt="a red fox in the snow", frames=124, height=64, width=64, steps=3, seed=7,
                          audio=False, parallel=2)


def children() -> list[int]:
    """Pids of this process's live children (every thread's)."""
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        pids += [int(p) for p in (task / "children").read_text().split()]
    return [p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_ranks_without_a_device_each_are_refused_in_one_line_before_anything_starts(h3_tiny: Path, tmp_path: Path):
    from models.parallel.launch import parallel_problem, run_parallel_generate

    assert parallel_problem("cuda", 2) == "--parallel 2 needs 2 CUDA devices; this machine has 0"
    assert "needs an accelerator" in parallel_problem("cpu", 2)
    assert "not mps" in parallel_problem("mps", 2)
    with pytest.raises(DeviceError, match="needs an accelerator"):
        run_parallel_generate(h3_tiny, PARALLEL, tmp_path / "clip.mp4", device="cpu")
    assert children() == [] and not (tmp_path / "clip.mp4").exists()


@pytest.mark.parametrize("parallel, compile, message", [
    (4, False, "4 ranks cannot split the DiT's 2 attention heads evenly"),
    (0, False, "must be a whole number of ranks in 1..8, got 0"),
    (2, True, "is not combined with --compile"),
])
def test_ranks_must_split_the_heads_evenly_and_come_without_untried_levers(h3_tiny: Path, parallel, compile, message):
    with pytest.raises(GenerateParamsError) as caught:
        validate_params(replace(PARALLEL, parallel=parallel, compile=compile), ModelSpec.read(h3_tiny))
    assert message in caught.value.problems["parallel"]


def test_a_sequence_the_ranks_cannot_split_evenly_is_named_with_its_rows():
    from models.parallel.rank import sequence_problem

    tags = torch.tensor([1] * 5 + [0] * 16 + [2] * 4)  # 5 text, 16 video, 4 audio rows
    assert sequence_problem(tags, 5) is None
    assert sequence_problem(tags, 2) == (
        "the packed sequence has 25 rows (5 text, 16 video, 4 audio), which 2 ranks cannot split evenly (diffusers'"
        " context parallelism shards equal parts); 1 rows more or 1 fewer would: change the prompt or the frame count")


def test_rank_0_runs_the_encoders_and_decoders_and_broadcasts_the_others_receive_and_skip_the_decode():
    from models.parallel.rank import (RankGroup, ReceiveOutputs, SendOutputs, SequenceCheck, rank_reads,
                                         split_workflow)
    from models.run.workflows import block_reads, workflow_blocks

    for rank in (0, 1):
        blocks = workflow_blocks("fl2va")
        reads = block_reads(blocks)
        group = RankGroup(rank, 2, torch.device("cpu"))
        split_workflow(blocks, reads, group)
        kinds = {name: type(block).__name__ for name, block in blocks.sub_blocks.items()}
        assert isinstance(blocks.sub_blocks["denoise.denoise:sequence"], SequenceCheck)
        assert list(blocks.sub_blocks).index("denoise.denoise:sequence") == list(blocks.sub_blocks).index(
            "denoise.denoise") - 1
        if rank == 0:
            assert isinstance(blocks.sub_blocks["text_encoder:send"], SendOutputs)
            assert [n for n, _ in blocks.sub_blocks["vae_encoder:send"].names] == ["condition_latents"]
            assert {"decode.video", "decode.audio"} <= set(kinds)
            assert rank_reads(reads, group) == reads
        else:
            assert kinds["text_encoder"] == kinds["vae_encoder"] == ReceiveOutputs.__name__
            assert not any(name.startswith("decode.") or name.endswith(":send") for name in kinds)
            assert {c for r in rank_reads(reads, group).values() for c in r} == {"transformer"}


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_the_forecast_gives_each_rank_the_whole_dit_a_share_of_the_sequence_and_the_walls_every_rank(
        h3_tiny: Path, kind):
    from machine.device import DeviceInfo
    from machine.offload import OffloadSettings
    from models.forecast import forecast_generate, packed_rows

    info = DeviceInfo(kind, kind, 0 if kind == "cuda" else None, kind, kind == "cpu", 150 * 2**30, "test", "")

    def forecast(ranks: int):
        return forecast_generate(h3_tiny, replace(PARALLEL, parallel=ranks), device_info=info,
                                 settings=OffloadSettings(), sequential_components=True)

    one, two, four = forecast(1), forecast(2), forecast(4 if kind == "cpu" else 2)
    assert one.ranks == [] and two.tokens == one.tokens == packed_rows(h3_tiny, PARALLEL)
    first, other = two.ranks
    assert (first.ranks, other.ranks, [r.ranks for r in four.ranks][-1]) == ("0", "1", "1-3" if kind == "cpu" else "1")
    side = "host_bytes" if kind == "cpu" else "device_bytes"
    def of(rank, name: str):
        return next(s for s in rank.stages if s.stage == name)

    single, rank0, rank1 = one.stage("denoise.denoise"), of(first, "denoise.denoise"), of(other, "denoise.denoise")
    assert rank0.stage == rank1.stage == "denoise.denoise" and rank0 == rank1  # the DiT's stage is alike everywhere
    assert rank0.activation_bytes == single.activation_bytes // 2
    assert getattr(rank0, side) == getattr(single, side) - (single.activation_bytes - single.activation_bytes // 2)
    assert rank0.weight_bytes == single.weight_bytes == one.component_bytes["transformer"]
    text0, text1 = of(first, "text_encoder"), of(other, "text_encoder")
    assert text0 == one.stage("text_encoder") and text1.weight_bytes == 0 and text1.activation_bytes == 0
    joint = two.stage("text_encoder")  # the host holds every rank, each GPU one
    assert joint.host_bytes == text0.host_bytes + text1.host_bytes
    assert joint.device_bytes == max(text0.device_bytes, text1.device_bytes)
    assert two.to_dict()["ranks"][1]["peak_bytes"] == other.peak_bytes > 0


def _marked(mark: str) -> list[int]:
    """Pids of the live processes whose environment holds `mark`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if mark.encode() in (proc / "environ").read_bytes() and _state(int(proc.name)) != "Z":
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_ranks_die_with_a_launcher_killed_while_they_start(h3_tiny: Path, tmp_path: Path, one_accelerator):
    """SIGKILL reaches no rank through its parent: each asks to die with it (PR_SET_PDEATHSIG), and one whose
    parent is already gone when it asks (still importing torch) exits by itself."""
    import signal
    import subprocess
    import sys
    import time
    import uuid

    mark = f"DRAINBOARD_TEST_MARK={uuid.uuid4().hex}"
    code = ("import sys, torch; torch.accelerator.device_count = lambda: 1\n"
            "from models.request.params import GenerateParams\nfrom models.parallel.launch import run_parallel_generate\n"
            f"run_parallel_generate(sys.argv[1], GenerateParams(**{replace(PARALLEL, steps=400).to_dict()!r}), sys.argv[2], device='cpu')")
    launcher = subprocess.Popen([sys.executable, "-c", code, str(h3_tiny), str(tmp_path / "clip.mp4")],
                                env={**os.environ, mark.split("=")[0]: mark.split("=")[1]},
                                cwd=Path(__file__).resolve().parents[2])
    deadline = time.monotonic() + 120
    while len([p for p in _marked(mark) if p != launcher.pid]) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len([p for p in _marked(mark) if p != launcher.pid]) == 2, "the ranks never started"
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 60  # a rank left running would denoise 399 steps for minutes
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _marked(mark) == []


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_ranks_spread_one_per_host_are_checked_per_host_not_summed(h3_tiny: Path, kind):
    """Ray's STRICT_SPREAD (jobs.backends.ray_ranks): each node holds one rank, so the walls see the fuller of rank 0
    and the others on the host, and one rank's process start-up, where one host holding both sums them."""
    from machine.device import DeviceInfo
    from machine.offload import OffloadSettings
    from models.forecast import forecast_generate

    info = DeviceInfo(kind, kind, 0 if kind == "cuda" else None, kind, kind == "cpu", 150 * 2**30, "test", "")

    def forecast(per_host: int | None):
        return forecast_generate(h3_tiny, PARALLEL, device_info=info, settings=OffloadSettings(),
                                 sequential_components=True, ranks_per_host=per_host)

    together, spread = forecast(None), forecast(1)
    assert spread.ranks == together.ranks
    first, other = spread.ranks
    for joint, alone, a, b in zip(together.stages, spread.stages, first.stages, other.stages):
        assert joint.host_bytes == a.host_bytes + b.host_bytes
        assert alone.host_bytes == max(a.host_bytes, b.host_bytes)
        assert alone.device_bytes == joint.device_bytes == max(a.device_bytes, b.device_bytes)
    assert spread.stage("denoise.denoise").host_bytes < together.stage("denoise.denoise").host_bytes
    assert spread.process_host_bytes * 2 == together.process_host_bytes
