"""The load kind with more than one rank: the sharded launcher runs, and every rank gets its own curve.

A spec with `gpus > 1` needs a CUDA device when queued, so on this CPU-only
machine the kind is called directly with a spec for two gloo ranks.
"""

import pytest
import torch
from safetensors.torch import save_file

from jobs.context import JobContext
from jobs.kinds.load import run_load
from jobs.spec import JobSpec
from machine.memory import MemoryProbe
from storage.queries import get_job, samples_since


@pytest.fixture
def six_tensor_checkpoint(config):
    """One safetensors file of six random 9 x 4 float32 tensors (9 rows: an uneven split over 2 ranks)."""
    g = torch.Generator().manual_seed(0)
    path = config.model_roots[0] / "six.safetensors"
    save_file({f"blocks.{i}.weight": torch.randn(9, 4, generator=g) for i in range(6)}, str(path))
    return path


@pytest.mark.slow
def test_kind_load_with_two_ranks_records_each_rank_and_returns_the_aggregate(db, config, queue_job, six_tensor_checkpoint):
    job_id = queue_job("load", model=str(six_tensor_checkpoint))
    spec = JobSpec(kind="load", model=str(six_tensor_checkpoint), device="cpu", gpus=2, sample_every=2)
    with MemoryProbe("cpu") as probe:
        ctx = JobContext(job_id, db_path=config.db_path, data_dir=config.data_dir, probe=probe, sample_every=2)
        try:
            metrics = run_load(spec, ctx)
        finally:
            ctx.close()
    assert metrics["world_size"] == 2 and [r["rank"] for r in metrics["ranks"]] == [0, 1]
    assert metrics["bytes_read"] == metrics["checkpoint_bytes"] == 6 * 9 * 4 * 4
    assert [r["bytes_placed"] for r in metrics["ranks"]] == [6 * 5 * 4 * 4, 6 * 4 * 4 * 4]
    for rank in (0, 1):
        load = [s for s in samples_since(db, job_id, rank=rank) if s["stage"] == "load"]
        assert [s["tensors_placed"] for s in load] == [2, 4, 6]
        assert load[-1]["bytes_placed"] == metrics["ranks"][rank]["bytes_placed"]
    assert (get_job(db, job_id)["progress_done"], get_job(db, job_id)["progress_total"]) == (6, 6)
