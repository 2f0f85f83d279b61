"""A parallel generate under Ray: its ranks in a placement group, spread over two raylets of this machine.

The placement rules and the local ranks are plain functions (run by default). The runs need a cluster of two "nodes"
(a head and a second raylet, one CPU each, so the two ranks cannot share one and go one per node) and are marked
`ray`; the ranks are the `tiny` profile's on 2 gloo ranks under the fake accelerator (tests/fake_accelerator, put on
the cluster's PYTHONPATH: a node's own PYTHONPATH follows the checkout in a Ray job's).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
from pathlib import Path

import pytest

from jobs.backends.ray_ranks import local_ranks, placement, rank_bundle
from storage.artifacts import job_dir
from storage.queries import artifacts, events, samples_since
from tests.jobs.ray_cluster import LocalCluster, running, supervising
from tests.jobs.test_kind_generate_parallel import TWO_RANKS, ranks_among

FAKE_ACCELERATOR = str(Path(__file__).resolve().parents[1] / "fake_accelerator")
DEVICE = os.environ.get("DRAINBOARD_TEST_RAY_DEVICE", "cpu")
"""The ranks' device in the runs: `cpu` (gloo, the fake accelerator), or `cuda` on a machine of two GPUs, one per
raylet, so the ranks talk NCCL between the two "nodes" (`-k "spreads or killed or dies"`: the other tests are the
CPU cluster's)."""


def test_one_node_holding_every_rank_gets_them_all_else_one_node_each_else_none():
    gpu, cpu = rank_bundle("cuda"), rank_bundle("cpu")
    spark = {"CPU": 20.0, "GPU": 1.0, "memory": 1e11}
    assert placement([spark, spark], gpu, 2) == "STRICT_SPREAD"  # two Sparks, one GPU each
    assert placement([spark, {**spark, "GPU": 8.0}], gpu, 2) == "STRICT_PACK"  # one node holds both
    assert placement([spark], gpu, 2) is None
    assert placement([spark, {"CPU": 20.0}], gpu, 2) is None  # a CPU-only node holds no GPU rank
    assert placement([{"CPU": 1.0}, {"CPU": 1.0}], cpu, 2) == "STRICT_SPREAD"
    assert placement([{"CPU": 2.0}, {"CPU": 1.0}], cpu, 2) == "STRICT_PACK"
    assert placement([{"CPU": 1.0, "GPU": 4.0}], gpu, 2) is None  # a GPU rank holds a CPU too


def test_each_rank_s_local_rank_counts_the_ranks_before_it_on_its_node():
    assert local_ranks(["a", "b"]) == [(0, 1), (0, 1)]
    assert local_ranks(["a", "a", "b", "a"]) == [(0, 3), (1, 3), (0, 1), (2, 3)]


@pytest.fixture(scope="module")
def two_nodes():
    cuda = DEVICE == "cuda"
    with running(LocalCluster(cpus=1, worker_cpus=1, env={} if cuda else {"PYTHONPATH": FAKE_ACCELERATOR},
                              gpus=("0", "1") if cuda else ())) as cluster:
        yield cluster


@pytest.fixture
def device(request) -> str:
    """`DEVICE`; on the CPU with one fake accelerator here and on the nodes (tests/fake_accelerator)."""
    if DEVICE == "cpu":
        request.getfixturevalue("one_accelerator")
    return DEVICE


@pytest.fixture
def supervisor(config, two_nodes):
    """The conftest's supervisor (and so its tick_until and run_to_end), on the two nodes."""
    with supervising(config, two_nodes) as sup:
        yield sup


def _placement_groups(address: str) -> list:
    from ray.util.state import list_placement_groups

    return list_placement_groups(address=address, detail=True, raise_on_missing_output=False)


def _ranks(cluster: LocalCluster) -> dict[int, int]:
    """Rank -> pid of the parallel generate ranks the cluster's nodes run."""
    return ranks_among(cluster.processes())


@pytest.mark.ray
def test_a_parallel_generate_spreads_its_ranks_one_per_node_and_reports_every_rank(
        device, db, config, queue_job, run_to_end, tiny_model, two_nodes):
    before = {g.placement_group_id for g in _placement_groups(two_nodes.address)}
    job = run_to_end(queue_job("generate", model=str(tiny_model), device=device, generate=TWO_RANKS), timeout=300)
    job_id = job["id"]
    assert job["status"] == "succeeded", job["error"]

    rows = events(db, job_id)
    [submitted] = [e for e in rows if e["kind"] == "ray" and e["message"].startswith("submitted")]
    [placed] = [e for e in rows if e["kind"] == "ray" and e["message"].startswith("ranks placed")]
    assert submitted["data"]["entrypoint_num_gpus"] == 0  # the placement group holds the ranks' share
    from ray.util.state import list_nodes

    address = {n.node_id: n.node_ip for n in list_nodes(address=two_nodes.address)}
    first, second = placed["data"]["nodes"]
    assert first != second  # one rank on each raylet, rank 0's address the one its node joined with
    assert placed["message"] == (f"ranks placed by Ray (STRICT_SPREAD): rank 0 on {address[first]} (node {first[:8]}),"
                                 f" rank 1 on {address[second]} (node {second[:8]})")
    assert sorted(e["message"].split(" on ")[0] for e in rows if e["kind"] == "load") == [
        "loaded text_encoder", "loaded transformer", "loaded vae", "rank 1: loaded transformer"]
    assert "denoise.denoise" in {s["stage"] for s in samples_since(db, job_id, rank=1)}
    assert "decode.video" in {s["stage"] for s in samples_since(db, job_id, rank=0)}
    assert [r["rank"] for r in job["metrics"]["ranks"]] == [0, 1]

    [video] = [a for a in artifacts(db, job_id) if a["media_type"] == "video/mp4"]
    mp4 = job_dir(config.data_dir, job_id) / video["name"]
    assert mp4.read_bytes()[4:8] == b"ftyp" and video["size"] == mp4.stat().st_size > 0  # rank 0's, sent back

    [group] = [g for g in _placement_groups(two_nodes.address) if g.placement_group_id not in before]
    assert str(group.state) == "REMOVED" and _ranks(two_nodes) == {}


@pytest.mark.ray
def test_a_rank_killed_on_its_node_fails_the_job_naming_it_and_releases_the_placement_group(
        device, db, queue_job, tick_until, run_to_end, tiny_model, two_nodes):
    before = {g.placement_group_id for g in _placement_groups(two_nodes.address)}
    job_id = queue_job("generate", model=str(tiny_model), device=device, generate={**TWO_RANKS, "steps": 1000})
    tick_until(lambda: any(s["stage"] == "denoise.denoise" for s in samples_since(db, job_id, rank=1)), timeout=300)
    os.kill(_ranks(two_nodes)[1], signal.SIGKILL)  # the nodes are this machine: the rank is a local pid
    job = run_to_end(job_id, timeout=120)
    assert job["status"] == "failed", job["error"]
    assert job["error"].startswith("ParallelRunError: rank 1 of 2 was killed (SIGKILL) (in stage denoise.denoise")
    assert "its last sample: RSS " in job["error"] and job["error"].endswith("the other ranks were stopped")
    assert _ranks(two_nodes) == {}
    [group] = [g for g in _placement_groups(two_nodes.address) if g.placement_group_id not in before]
    assert str(group.state) == "REMOVED"


def test_a_cluster_that_cannot_place_the_ranks_is_named_in_one_line():
    from jobs.backends.ray_ranks import placement_problem

    assert placement_problem([{"GPU": 1.0}, {"GPU": 1.0}], {"GPU": 1.0}, 2) is None
    assert placement_problem([{"GPU": 1.0, "CPU": 20.0}, {"CPU": 8.0}], rank_bundle("cuda"), 2) == (
        "--parallel 2 under Ray needs 2 ranks of 1 GPU and 1 CPU on one node or one on each of 2 nodes; the"
        " cluster's alive nodes hold: 1 GPU, 20 CPU; 0 GPU, 8 CPU")


@pytest.mark.ray
def test_submit_asks_the_cluster_how_it_would_place_the_ranks_and_lets_the_job_wait_when_it_does_not_answer(
        two_nodes):
    from jobs.backends.ray_ranks import cluster_placement

    assert cluster_placement(two_nodes.address, "cpu", 2) == ("STRICT_SPREAD", None)
    strategy, problem = cluster_placement(two_nodes.address, "cuda", 2)
    assert strategy is None and problem.endswith("the cluster's alive nodes hold: 0 GPU, 1 CPU; 0 GPU, 1 CPU")
    assert cluster_placement("http://127.0.0.1:1", "cuda", 2) == (None, None)


@pytest.mark.ray
def test_a_job_the_cluster_spreads_is_forecast_and_checked_one_rank_per_host(
        one_accelerator, config, tiny_model, two_nodes):
    from jobs.admission import processes
    from jobs.spec import build_spec
    from machine.device import probe_device

    raw = {"kind": "generate", "model": str(tiny_model), "device": "cpu", "generate": TWO_RANKS}
    local = build_spec(raw, config)
    spread = build_spec(raw, dataclasses.replace(config, ray_address=two_nodes.address))
    assert (local.options.ray_placement, spread.options.ray_placement) == (None, "STRICT_SPREAD")
    assert (processes(local), processes(spread)) == (3, 2)  # the child and its ranks; the child and one rank

    info = probe_device("cpu")
    together = {n.stage: n.host for n in local.job_kind.forecast(local, info, None).stages}
    alone = {n.stage: n.host for n in spread.job_kind.forecast(spread, info, None).stages}
    assert alone.keys() == together.keys() and all(alone[s] <= together[s] for s in alone)
    assert alone["denoise.denoise"] < together["denoise.denoise"]


@pytest.mark.ray
def test_a_rank_whose_ray_worker_dies_fails_the_job_saying_so_and_takes_its_rank_with_it(
        device, db, queue_job, tick_until, run_to_end, tiny_model, two_nodes):
    """As a node lost: the actor holding rank 1's bundle is SIGKILLed while the rank starts; the rank dies with it
    (PR_SET_PDEATHSIG) and the parent's next poll of that actor names it."""
    job_id = queue_job("generate", model=str(tiny_model), device=device, generate=TWO_RANKS)
    tick_until(lambda: 1 in _ranks(two_nodes), timeout=300)
    rank = _ranks(two_nodes)[1]
    actor = int(Path(f"/proc/{rank}/stat").read_text().rsplit(")", 1)[1].split()[1])  # the rank's parent
    os.kill(actor, signal.SIGKILL)
    job = run_to_end(job_id, timeout=120)
    assert job["status"] == "failed", job["error"]
    assert re.match(r"ParallelRunError: rank 1 of 2 failed: its Ray worker on \S+ died: .*; the other ranks were "
                    r"stopped$", job["error"]), job["error"]
    assert _ranks(two_nodes) == {}
