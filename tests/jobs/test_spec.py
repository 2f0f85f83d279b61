import json
import threading

import pytest
import torch

from jobs.queue import claim, enqueue, retry, submit
from jobs.spec import JobSpec, JobSpecError, build_spec
from machine.device import DeviceInfo
from storage import jobs_table
from storage.schema import open_database
from storage.queries import get_job, list_jobs


def model(config, name="dummy.safetensors"):
    return str(config.model_roots[0] / name)


@pytest.mark.parametrize(
    "fields, field, message",
    [
        ({"model": "/etc/passwd"}, "model", "outside the model roots"),
        ({"model": "MISSING"}, "model", "does not exist"),
        ({"mode": "stram"}, "mode", "unknown placement mode 'stram'; known: drain, retain, stream"),
        ({"device": "gpu0"}, "device", "not understood"),
        ({"dtype": "int3"}, "dtype", "unknown dtype 'int3'"),
        ({"sample_every": -1}, "sample_every", "must be at least 1, got -1"),
        ({"memory_limit": "-700MB"}, "memory_limit", "'-700MB' is negative"),
        ({"memory_limit": "1e30"}, "memory_limit", "'1e30' is not a size"),
        ({"memory_limit": "0.5"}, "memory_limit", "'0.5' is too small; the minimum is 1.0 MiB"),
        ({"memory_budget": "lots"}, "memory_budget", "'lots' is not a size"),
        ({"memory_floor": "512KiB"}, "memory_floor", "the minimum is 1.0 MiB"),
        ({"drop_page_cache": "yes"}, "drop_page_cache", "must be true, false or unset"),
        ({"sequential_components": True}, "sequential_components", "only generate jobs take it, not 'load'"),
        ({"device": "cuda"}, "device", "'cuda' is not available here"),
        ({"drop_page_cache": True, "mode": "drain"}, "drop_page_cache", "only the stream mode drops the page cache"),
        ({"gpus": 2}, "gpus", "need a cuda device"),
        ({"offload": {"dit_cpu_ofload": False}}, "offload", "unknown flags dit_cpu_ofload"),
        ({"kind": "train"}, "kind", "unknown job kind 'train'"),
        ({"colour": "red"}, "colour", "unknown field"),
        ({"kind": "generate", "generate": {}}, "generate.prompt", "a prompt is required"),
        ({"kind": "generate", "generate": {"prompt": "a fox", "steps": 1.5}}, "generate.steps", "must be an integer"),
        ({"generate": {"prompt": "x"}}, "generate", "only generate jobs take it, not 'load'"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(config, fields, field, message):
    raw = {"kind": "load", "model": model(config), **fields}
    if raw["model"] == "MISSING":
        raw["model"] = model(config, "missing.safetensors")
    with pytest.raises(JobSpecError) as caught:
        build_spec(raw, config)
    assert caught.value.field == field
    assert message in str(caught.value)


def test_memory_sizes_and_policy_switches_are_exact_and_round_trip_through_storage(db, config, tiny_model):
    spec = build_spec({"kind": "generate", "model": str(tiny_model), "generate": {"prompt": "a fox"},
                       "memory_budget": "0.5GiB", "memory_floor": 3 * 2**30, "sequential_components": True}, config)
    assert (spec.memory_budget, spec.memory_floor, spec.options.sequential_components) == (2**29, 3 * 2**30, True)
    assert JobSpec.from_dict(get_job(db, enqueue(db, spec))["spec"]) == spec


def test_drop_page_cache_is_refused_where_no_loader_would_apply_it(config, tiny_model):
    with pytest.raises(JobSpecError) as caught:
        build_spec({"kind": "generate", "model": str(tiny_model), "generate": {"prompt": "a fox"},
                    "drop_page_cache": False}, config)
    assert "drop_page_cache: only load jobs take it, not 'generate'" in caught.value.errors
    assert build_spec({"kind": "load", "model": model(config), "drop_page_cache": True}, config).options.drop_page_cache


def test_a_spec_stored_before_the_memory_fields_existed_reads_back_with_policy_defaults(config):
    stored = build_spec({"kind": "load", "model": model(config)}, config).to_dict()
    for name in ("memory_budget", "memory_floor", "drop_page_cache"):
        del stored[name]
    spec = JobSpec.from_dict(stored)
    assert (spec.memory_budget, spec.memory_floor, spec.options.drop_page_cache) == (None,) * 3


def test_an_unknown_component_is_refused_at_once_listing_the_checkpoints_own(config, tiny_model):
    with pytest.raises(JobSpecError) as caught:
        build_spec({"kind": "load", "model": str(tiny_model), "component": "transfomer"}, config)
    assert caught.value.errors == [
        f"component: {tiny_model} has no component 'transfomer'; known: audio_vae, text_encoder, transformer, transformer_ref, vae"
    ]
    assert build_spec({"kind": "load", "model": str(tiny_model), "component": "vae"}, config).component == "vae"


def test_an_unreadable_checkpoint_is_refused_at_submit_naming_its_file(config):
    broken = config.model_roots[0] / "broken"
    broken.mkdir()
    (broken / "model_index.json").write_text("{")
    with pytest.raises(JobSpecError, match=r"model: model_index.json: not valid JSON"):
        build_spec({"kind": "load", "model": str(broken), "component": "transformer"}, config)


def test_a_prompt_with_a_byte_that_is_not_utf8_is_refused_naming_the_byte(config, tiny_model):
    prompt = b"a \xff fox".decode("utf-8", "surrogateescape")  # what argv holds for that byte
    with pytest.raises(JobSpecError) as caught:
        build_spec({"kind": "generate", "model": str(tiny_model), "generate": {"prompt": prompt}}, config)
    assert caught.value.errors == ["generate.prompt: is not valid UTF-8 text: byte 0xff at position 2"]


def _probe(present: set[str]):
    """A device probe that finds exactly the CUDA ordinals in `present` (the loader probe's failure shape)."""

    def probe(spec: str) -> DeviceInfo:
        if spec in present:
            return DeviceInfo(spec, "cuda", int(spec[5:]), "GPU", False, 80 * 2**30, "cuda-driver", "discrete")
        return DeviceInfo(spec, "cuda", int(spec[5:]), f"CUDA device {spec[5:]}", False, None, "probe-failed",
                          "cuDeviceGet failed with CUDA_ERROR_INVALID_DEVICE (101); treating it as discrete, so "
                          "offload flags stay as set")

    return probe


def test_cuda_on_a_torch_without_cuda_is_refused_at_submit(config, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    with pytest.raises(JobSpecError) as caught:
        build_spec({"kind": "load", "model": model(config), "device": "cuda"}, config, probe=_probe({"cuda:0"}))
    assert caught.value.errors == [f"device: 'cuda' is not available here: this torch ({torch.__version__}) "
                                   "is built without CUDA"]


def test_cuda_devices_the_driver_does_not_have_are_refused_at_submit(config, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    raw = {"kind": "load", "model": model(config)}
    with pytest.raises(JobSpecError) as caught:
        build_spec({**raw, "device": "cuda:1"}, config, probe=_probe({"cuda:0"}))
    assert caught.value.errors == ["device: cuda:1 is not available here: cuDeviceGet failed with "
                                   "CUDA_ERROR_INVALID_DEVICE (101)"]
    with pytest.raises(JobSpecError, match="gpus: cuda:2 is not available here"):
        build_spec({**raw, "device": "cuda", "gpus": 3}, config, probe=_probe({"cuda:0", "cuda:1"}))
    assert build_spec({**raw, "device": "cuda", "gpus": 2}, config, probe=_probe({"cuda:0", "cuda:1"})).gpus == 2


def test_a_quantized_dit_that_cannot_run_on_the_device_is_refused_at_submit(config, tiny_model, monkeypatch):
    import models.quantization.check as check

    raw = {"kind": "generate", "model": str(tiny_model), "generate": {"prompt": "a fox", "quantize": "fp8"}}
    monkeypatch.setattr(check, "torchao_installed", lambda: True)
    with pytest.raises(JobSpecError) as caught:
        build_spec(raw, config)
    assert caught.value.errors == ["generate.quantize: fp8 needs a CUDA GPU of compute capability 8.9 or newer; cpu "
                                   "has no CUDA (int8 runs on CPU and CUDA)"]
    # A GPU the driver reports below 8.9 (an A100) is refused too; one at 9.0 (an H200) is not.
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    for capability, refused in (((8, 0), True), ((9, 0), False)):
        monkeypatch.setattr(check, "cuda_capability", lambda kind, index, c=capability: c)
        cuda = {**raw, "device": "cuda:0"}
        if refused:
            with pytest.raises(JobSpecError, match="cuda:0 has compute capability 8.0"):
                build_spec(cuda, config, probe=_probe({"cuda:0"}))
        else:
            assert build_spec(cuda, config, probe=_probe({"cuda:0"})).options.generate.quantize == "fp8"
    int8 = {**raw, "generate": {"prompt": "a fox", "quantize": "int8"}}
    assert build_spec(int8, config).options.generate.quantize == "int8"
    monkeypatch.setattr(check, "torchao_installed", lambda: False)
    with pytest.raises(JobSpecError, match="generate.quantize: int8 quantization needs torchao, which is not "
                                           "installed here: `pip install -r requirements-quant.txt`"):
        build_spec(int8, config)


def test_a_refused_submit_queues_nothing(db, config):
    with pytest.raises(JobSpecError, match="outside the model roots"):
        submit(db, {"kind": "load", "model": "/etc/passwd"}, config)
    assert list_jobs(db) == []


def test_every_bad_field_is_listed_at_once(config):
    with pytest.raises(JobSpecError) as caught:
        build_spec({"kind": "load", "model": "/nope", "mode": "x", "sample_every": 0}, config)
    assert [e.split(":")[0] for e in caught.value.errors] == ["model", "mode", "sample_every"]


def test_a_valid_spec_is_normalised_and_round_trips_through_storage(db, config):
    spec = build_spec({"kind": "load", "model": model(config), "dtype": "bf16", "memory_limit": "1GiB",
                       "offload": {"dit_cpu_offload": False}}, config)
    assert (spec.dtype, spec.memory_limit, spec.offload.dit_cpu_offload) == ("bfloat16", 2**30, False)
    job_id = enqueue(db, spec)
    assert JobSpec.from_dict(get_job(db, job_id)["spec"]) == spec


def test_a_valid_generate_spec_round_trips_through_storage(db, config, tiny_model):
    spec = build_spec({"kind": "generate", "model": str(tiny_model), "generate": {"prompt": "a fox", "frames": "141"}},
                      config)
    assert spec.options.generate.frames == 141 and spec.options.generate.prompt == "a fox"
    assert JobSpec.from_dict(get_job(db, enqueue(db, spec))["spec"]) == spec


def test_retry_queues_a_new_job_with_the_same_spec(db, config):
    first = submit(db, {"kind": "steps", "model": model(config)}, config)
    jobs_table.finish(db, first, "failed")
    second = retry(db, first, config)
    assert get_job(db, second)["spec"] == get_job(db, first)["spec"]
    assert get_job(db, second)["retry_of"] == first and get_job(db, second)["status"] == "queued"
    third = retry(db, first, config, changes={"mode": "drain"})
    assert get_job(db, third)["spec"] == {**get_job(db, first)["spec"], "mode": "drain"}


def test_retry_checks_the_spec_again_and_queues_nothing_when_it_no_longer_holds(db, config):
    first = submit(db, {"kind": "steps", "model": model(config)}, config)
    jobs_table.finish(db, first, "failed")
    (config.model_roots[0] / "dummy.safetensors").unlink()
    with pytest.raises(JobSpecError, match="model: .*dummy.safetensors does not exist"):
        retry(db, first, config)
    with pytest.raises(JobSpecError, match="mode: unknown placement mode 'stram'"):
        retry(db, first, config, changes={"mode": "stram"})
    assert [job["id"] for job in list_jobs(db)] == [first]


def test_two_supervisors_never_claim_the_same_job(db, config):
    spec = build_spec({"kind": "steps", "model": model(config)}, config)
    ids = [enqueue(db, spec) for _ in range(60)]
    claimed: dict[str, list[int]] = {"a": [], "b": [], "c": []}

    def claim_all(name: str) -> None:
        own = open_database(config.db_path)
        while (job := claim(own, name)) is not None:
            claimed[name].append(job["id"])
        own.conn.close()

    threads = [threading.Thread(target=claim_all, args=(name,)) for name in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = sorted(claimed["a"] + claimed["b"] + claimed["c"])
    assert every == ids
    assert {get_job(db, i)["supervisor_id"] for i in claimed["a"]} <= {"a"}


def test_retry_accepts_a_generate_submitted_without_a_canvas(db, config, tiny_model):
    """Height and width left to the checkpoint are stored as None; retrying must accept what submit did."""
    first = submit(db, {"kind": "generate", "model": str(tiny_model), "generate": {"prompt": "a fox"}}, config)
    assert get_job(db, first)["spec"]["generate"]["height"] is None
    jobs_table.finish(db, first, "failed")
    second = retry(db, first, config)
    before, after = get_job(db, first)["spec"], get_job(db, second)["spec"]
    # The forecast is made again at retry: its stages are the same, its walls read MemAvailable now.
    assert {k: v for k, v in after.items() if k != "forecast"} == {k: v for k, v in before.items() if k != "forecast"}
    assert after["forecast"]["stages"] == before["forecast"]["stages"]
    edited = retry(db, first, config, changes={"mode": "drain"})
    assert get_job(db, edited)["spec"]["generate"]["width"] is None


@pytest.mark.parametrize("fields", [{"component": "x/" * 13_000}, {"mode": "m" * 26_000}, {"sample_every": "9z" * 13_000},
                                    {"memory_limit": "5" * 26_000 + "XB"}])
def test_crafted_input_is_quoted_back_bounded(config, fields):
    """What a form field carries comes back in the page's alert: at most a short quote of it, never 26 KB."""
    with pytest.raises(JobSpecError) as caught:
        build_spec({"kind": "load", "model": model(config), **fields}, config)
    assert len(str(caught.value)) < 400 and "characters)" in str(caught.value)


def test_a_single_file_transformer_is_resolved_under_the_roots_and_checked_at_submit(config, tiny_model, tmp_path):
    from tests.models.reference_layout import reference_tensors, write_single_file

    tensors = reference_tensors(tiny_model / "transformer")
    inside = write_single_file(tensors, config.model_roots[0] / "dit.safetensors", data_start_mod8=7)
    spec = build_spec({"kind": "generate", "model": str(tiny_model),
                       "generate": {"prompt": "a fox", "transformer": str(inside), "qkv_layout": "interleaved"}}, config)
    assert (spec.options.generate.transformer, spec.options.generate.qkv_layout) == (str(inside), "interleaved")
    away = write_single_file(tensors, tmp_path / "away.safetensors")
    with pytest.raises(JobSpecError) as refused:
        build_spec({"kind": "generate", "model": str(tiny_model),
                    "generate": {"prompt": "a fox", "transformer": str(away)}}, config)
    assert refused.value.field == "generate.transformer"
    assert f"a root holding it: {tmp_path}" in str(refused.value)
    tensors["adaln_t_table"] = torch.zeros(10, 4)
    pruned = write_single_file(tensors, config.model_roots[0] / "pruned.safetensors")
    with pytest.raises(JobSpecError, match="pruned.safetensors: a pruned MiniMax H3 DiT"):
        build_spec({"kind": "generate", "model": str(tiny_model),
                    "generate": {"prompt": "a fox", "transformer": str(pruned)}}, config)


def test_a_lever_the_device_cannot_run_is_refused_at_submit_and_a_runnable_set_is_recorded(config, tiny_model):
    raw = {"kind": "generate", "model": str(tiny_model), "generate": {"prompt": "a fox", "attention": "_native_cudnn"}}
    with pytest.raises(JobSpecError) as caught:
        build_spec(raw, config)
    assert caught.value.errors == ["generate.attention: _native_cudnn: cuDNN attention runs on CUDA only, not on cpu;"
                                   " on cpu use native or _native_flash"]
    levers = {"attention": "_native_flash", "compile": True, "step_cache": "taylorseer", "vae_compile": True}
    spec = build_spec({**raw, "generate": {"prompt": "a fox", **levers}}, config)
    stored = JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))).options.generate
    assert {name: getattr(stored, name) for name in levers} == levers
    for name in ("compile", "vae_compile"):
        with pytest.raises(JobSpecError, match=f"generate.{name}: must be true or false, got 'yes'"):
            build_spec({**raw, "generate": {"prompt": "a fox", name: "yes"}}, config)
