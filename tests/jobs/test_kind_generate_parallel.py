"""A generate job with `parallel`: its ranks' samples and events under their rank, rank 0's stages as the job's."""

import av
import pytest

from jobs.spec import JobSpecError, build_spec
from storage.artifacts import job_dir
from storage.queries import artifacts, events, samples_since

TWO_RANKS = {"prompt": "a red fox in the snow", "frames": 124, "height": 64, "width": 64, "steps": 3, "audio": False,
             "parallel": 2}
"""A tiny clip on 2 ranks whose packed sequence (574 rows) divides by 2."""


def test_more_ranks_than_the_device_can_place_are_refused_before_queueing(config, tiny_model):
    spec = {"kind": "generate", "model": str(tiny_model), "device": "cpu",
            "generate": {"prompt": "a red fox", "parallel": 2}}
    with pytest.raises(JobSpecError) as caught:
        build_spec(spec, config)
    assert caught.value.field == "generate.parallel" and "needs an accelerator" in str(caught.value)
    with pytest.raises(JobSpecError) as caught:
        build_spec({**spec, "generate": {"prompt": "a red fox", "parallel": "two"}}, config)
    assert caught.value.field == "generate.parallel" and "must be an integer" in str(caught.value)


def _frames(path):
    import numpy as np

    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)]).astype(np.int16)


@pytest.mark.slow
def test_a_parallel_generate_job_makes_the_single_process_frames_and_records_every_rank(
        one_accelerator, db, config, queue_job, run_to_end, tiny_model, tmp_path):
    """2 gloo ranks through diffusers' Ulysses attention against one process, both fp32 (bf16's rounding, reordered
    by the split attention, grows over the steps on random weights: 3.2 levels on average): the frames decoded from
    both MP4s differ by under 0.05 of a level on average, and fewer than 0.1% of values by more than 2 (the H.264
    encode of near-equal frames). Measured: 0.0004 and 0.006%."""
    import torch

    from models.request.params import GenerateParams
    from models.run.pipeline import run_generate

    job_id = queue_job("generate", model=str(tiny_model), dtype="fp32", generate=TWO_RANKS)
    job = run_to_end(job_id, timeout=300)
    assert job["status"] == "succeeded", job["error"]
    [video] = [a for a in artifacts(db, job_id) if a["media_type"] == "video/mp4"]
    single = run_generate(tiny_model, GenerateParams(**{**TWO_RANKS, "parallel": 1}), tmp_path / "single.mp4",
                          dtype=torch.float32)
    diff = abs(_frames(job_dir(config.data_dir, job_id) / video["name"]) - _frames(tmp_path / "single.mp4"))
    assert diff.shape == (124, 64, 64, 3) and diff.mean() < 0.05 and (diff > 2).mean() < 1e-3
    assert job["metrics"]["video_sha256"] != single.video_sha256  # two computations, not one run's file twice

    rows = events(db, job_id)
    started = [e["stage"] for e in rows if e["kind"] == "stage_start"]
    assert started[:3] == ["probe", "prepare", "load.text_encoder"] and "decode.video" in started
    assert sorted(e["message"].split(" on ")[0] for e in rows if e["kind"] == "load") == [
        "loaded text_encoder", "loaded transformer", "loaded vae", "rank 1: loaded transformer"]
    rank_stages = {e["data"]["stage"] for e in rows if e["kind"] == "rank_stage"}
    assert {"text_encoder", "load.transformer", "denoise.denoise"} <= rank_stages
    assert not any(s.startswith(("decode", "load.vae", "load.text_encoder")) for s in rank_stages)
    assert all(e["data"]["rank"] == 1 for e in rows if e["kind"] == "rank_stage")
    assert {e["message"] for e in rows if "context parallel" in e["message"]} == {
        "transformer: context parallel: Ulysses over 2 ranks (gloo)",
        "rank 1: transformer: context parallel: Ulysses over 2 ranks (gloo)"}
    assert (job["progress_done"], job["progress_total"]) == (2, 2)

    rank1 = {s["stage"] for s in samples_since(db, job_id, rank=1)}
    assert "denoise.denoise" in rank1 and not any(s.startswith("decode") for s in rank1 if s)
    assert "decode.video" in {s["stage"] for s in samples_since(db, job_id, rank=0)}
    metrics = job["metrics"]
    assert [r["rank"] for r in metrics["ranks"]] == [0, 1] and metrics["ranks"][1]["peak"] > 0


def test_a_sequence_the_ranks_cannot_split_evenly_is_refused_at_submit_with_its_rows(one_accelerator, config,
                                                                                       tiny_model):
    """The rows are the forecast's (`models.forecast.packed_rows`); a run of "a red fox" on 2 gloo ranks, the check
    skipped, stopped at diffusers' split with the same 569 (7 text, 148 video, 414 audio)."""
    from jobs.admission import processes

    spec = {"kind": "generate", "model": str(tiny_model), "device": "cpu",
            "generate": {"prompt": "a red fox", "frames": 124, "height": 64, "width": 64, "audio": False,
                         "parallel": 2}}
    with pytest.raises(JobSpecError) as caught:
        build_spec(spec, config)
    assert caught.value.field == "generate.parallel"
    assert "the packed sequence has 569 rows, which 2 ranks cannot split evenly" in str(caught.value)
    fits = build_spec({**spec, "generate": {**spec["generate"], "prompt": "a red fox in the snow"}}, config)
    assert fits.options.generate.parallel == 2 and processes(fits) == 3
    assert processes(build_spec({**spec, "generate": {"prompt": "a red fox"}}, config)) == 1


def test_under_ray_a_parallel_generate_s_driver_asks_no_gpu_and_its_child_places_the_ranks():
    """The ranks' placement group holds a GPU each (tests/jobs/test_ray_ranks.py); the driver holding them too would
    keep two Sparks of one GPU each from running `--parallel 2`."""
    from jobs.backends.ray_jobs import submission
    from jobs.backends.ray_ranks import ENV_RANKS
    from jobs.spec import JobSpec

    def asked(device: str, parallel: int) -> tuple[dict, str | None]:
        spec = JobSpec.from_dict({"kind": "generate", "model": "/models/h3", "device": device,
                                  "generate": {"prompt": "a fox", "parallel": parallel}}).to_dict()
        found = submission({"id": 7, "spec": spec}, _config(), "host:1:abc", "nonce")
        return ({k: v for k, v in found.items() if k.startswith("entrypoint_") and k != "entrypoint"},
                found["runtime_env"]["env_vars"].get(ENV_RANKS))

    assert asked("cuda", 2) == ({"entrypoint_num_gpus": 0}, "1")
    assert asked("cuda", 1) == ({"entrypoint_num_gpus": 1}, None)
    assert asked("cpu", 2) == ({"entrypoint_num_gpus": 0}, "1")


def _config():
    from pathlib import Path

    from storage.config import Config

    return Config(data_dir=Path("/tmp/drainboard-test-data"), model_roots=[Path("/models")])


def _descendants(pid: int) -> list[int]:
    """Live processes below `pid` (every thread's children, recursively)."""
    from pathlib import Path

    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            found += [child, *_descendants(child)]
    return found


def ranks_among(pids: list[int]) -> dict[int, int]:
    """Rank -> pid of the parallel generate ranks among `pids`."""
    from pathlib import Path

    ranks = {}
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"models.parallel.launch" in argv:
            ranks[int(argv[-2])] = pid
    return ranks


def _ranks_below(pid: int) -> dict[int, int]:
    """Rank -> pid of the parallel generate ranks running below `pid`."""
    return ranks_among(_descendants(pid))


@pytest.mark.slow
def test_a_rank_killed_mid_denoise_fails_the_job_naming_it_and_leaves_no_rank_running(
        one_accelerator, db, queue_job, tick_until, run_to_end, tiny_model):
    import os
    import signal

    job_id = queue_job("generate", model=str(tiny_model), generate={**TWO_RANKS, "steps": 1000})
    tick_until(lambda: any(s["stage"] == "denoise.denoise" for s in samples_since(db, job_id, rank=1)), timeout=300)
    os.kill(_ranks_below(os.getpid())[1], signal.SIGKILL)
    job = run_to_end(job_id, timeout=120)
    assert job["status"] == "failed"
    assert job["error"].startswith("ParallelRunError: rank 1 of 2 was killed (SIGKILL) (in stage denoise.denoise")
    assert "its last sample: RSS " in job["error"] and job["error"].endswith("the other ranks were stopped")
    assert _ranks_below(os.getpid()) == {}
