import json

import pytest
import torch
from safetensors.torch import save_file

from jobs.cgroups import memory_limit_support
from storage.queries import events, samples_since


def write_component(folder, tensors: dict) -> None:
    """A one-shard `transformer` component in the diffusers layout."""
    component = folder / "transformer"
    component.mkdir(parents=True)
    (folder / "model_index.json").write_text(json.dumps({"transformer": ["x", "Unknown"]}))
    (component / "config.json").write_text(json.dumps({"_class_name": "UnknownForTests"}))
    save_file(tensors, str(component / "model.safetensors"))


@pytest.fixture
def small_checkpoint(config):
    """12 random float32 tensors of 64 x 64 in data/models/small/transformer."""
    generator = torch.Generator().manual_seed(0)
    tensors = {f"blocks.{i}.weight": torch.randn(64, 64, generator=generator) for i in range(12)}
    write_component(config.model_roots[0] / "small", tensors)
    return config.model_roots[0] / "small"


@pytest.fixture
def big_checkpoint(config):
    """384 MiB of float32 in 24 tensors of 16 MiB, in data/models/big/transformer."""
    tensors = {f"blocks.{i}.weight": torch.full((2048, 2048), float(i + 1)) for i in range(24)}
    write_component(config.model_roots[0] / "big", tensors)
    return config.model_roots[0] / "big"


def test_kind_load_records_a_sample_every_n_tensors_and_stores_the_report(
    db, queue_job, run_to_end, small_checkpoint
):
    job_id = queue_job("load", model=str(small_checkpoint), component="transformer", sample_every=5, dtype="bf16")
    job = run_to_end(job_id)
    assert job["status"] == "succeeded", job["error"]
    assert job["metrics"]["bytes_placed"] == 12 * 64 * 64 * 2
    assert {"footprint_ratio", "host_peak_ratio", "load_seconds", "throughput_gbps"} <= set(job["metrics"])
    load_samples = [s for s in samples_since(db, job_id) if s["stage"] == "load"]
    assert [s["tensors_placed"] for s in load_samples] == [0, 5, 10, 12]  # the process before its first tensor
    assert load_samples[-1]["bytes_placed"] == job["metrics"]["bytes_placed"]
    kinds = [e["kind"] for e in events(db, job_id)]
    assert kinds[:2] == ["stage_start", "device"] and "decision" in kinds
    assert (job["progress_done"], job["progress_total"]) == (12, 12)


def test_kind_load_records_the_loaders_forecast_before_reading_beside_what_it_measured(
    db, queue_job, run_to_end, small_checkpoint
):
    from loader.forecast import forecast_load

    job_id = queue_job("load", model=str(small_checkpoint), component="transformer", mode="retain")
    job = run_to_end(job_id)
    assert job["status"] == "succeeded", job["error"]
    expected = forecast_load(small_checkpoint, component="transformer", mode="retain").predicted_peak_bytes
    assert job["metrics"]["forecast"]["predicted_peak_bytes"] == expected
    recorded = [e for e in events(db, job_id) if e["kind"] == "forecast"]
    assert len(recorded) == 1 and recorded[0]["data"]["predicted_peak_bytes"] == expected
    assert recorded[0]["stage"] != "load"  # before the first byte is read


needs_cgroup = pytest.mark.skipif(memory_limit_support() is not None, reason=f"{memory_limit_support()}")


@pytest.mark.slow
@needs_cgroup
def test_a_load_over_its_memory_limit_is_killed_and_the_cgroup_confirms_the_oom(
    db, queue_job, run_to_end, big_checkpoint
):
    # Forced: the submit check refuses it (jobs.admission); the cgroup is the line behind it.
    limited = queue_job("load", model=str(big_checkpoint), component="transformer", memory_limit="320MiB",
                        forced=True)
    job = run_to_end(limited)
    assert job["status"] == "killed" and job["signal"] == "SIGKILL", job["error"]
    assert "by the kernel OOM killer in the job's memory cgroup" in job["error"]
    assert job["metrics"]["cgroup_oom_kills"] >= 1 and job["metrics"]["memory_limit"] == 320 * 2**20
    last = samples_since(db, limited)[-1]
    assert last["cgroup_usage"] > 0
    assert f"last sample at {last['t']:.1f} s: stage {last['stage']}" in job["error"]

    unlimited = run_to_end(queue_job("load", model=str(big_checkpoint), component="transformer"))
    assert unlimited["status"] == "succeeded", unlimited["error"]
    assert unlimited["metrics"]["bytes_placed"] == 384 * 2**20


def test_a_load_job_probes_its_device_once_and_hands_that_probe_to_the_loader(
        db, config, queue_job, small_checkpoint, monkeypatch):
    """The probe stage's `DeviceInfo` reaches the placement (`LoadOptions.device_info`): no second probe."""
    import loader.api
    import loader.forecast
    import loader.placement.stream
    import machine.device
    from jobs.context import JobContext
    from jobs.kinds.load import run_load
    from jobs.spec import JobSpec
    from machine.memory import MemoryProbe

    probes, handed = [], []
    real_probe, real_load = machine.device.probe_device, loader.api.load_checkpoint

    def counted(*args, **kwargs):
        probes.append(real_probe(*args, **kwargs))
        return probes[-1]

    def load(path, options, **kwargs):
        handed.append(options.device_info)
        return real_load(path, options, **kwargs)

    job_id = queue_job("load", model=str(small_checkpoint), component="transformer")  # submit probes, in its process
    for module in (machine.device, loader.forecast, loader.placement.stream):
        monkeypatch.setattr(module, "probe_device", counted)
    monkeypatch.setattr(loader.api, "load_checkpoint", load)
    spec = JobSpec(kind="load", model=str(small_checkpoint), component="transformer", device="cpu")
    with MemoryProbe("cpu") as probe:
        ctx = JobContext(job_id, db_path=config.db_path, data_dir=config.data_dir, probe=probe, sample_every=5)
        try:
            run_load(spec, ctx)
        finally:
            ctx.close()
    assert len(probes) == 1 and handed == probes
