import threading

import pytest

from jobs.queue import claim, enqueue, retry, submit
from jobs.spec import JobSpec, JobSpecError, build_spec, parse_size
from storage.connections import connect
from storage.queries import get_job, list_jobs


@pytest.mark.parametrize("text, size", [("700MB", 700 * 10**6), ("4GiB", 4 * 2**30), ("512k", 512_000),
                                        ("1.5 GB", 1_500_000_000), ("123", 123), (2048, 2048)])
def test_sizes_take_decimal_and_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["-5MB", "0", "lots", "4 XB"])
def test_nonsense_and_non_positive_sizes_are_refused(text):
    with pytest.raises(ValueError):
        parse_size(text)


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
        ({"memory_limit": "-700MB"}, "memory_limit", "size must be positive"),
        ({"gpus": 2}, "gpus", "need a cuda device"),
        ({"offload": {"dit_cpu_ofload": False}}, "offload", "unknown flags dit_cpu_ofload"),
        ({"kind": "train"}, "kind", "unknown job kind 'train'"),
        ({"colour": "red"}, "colour", "unknown field"),
        ({"kind": "generate", "generate": {}}, "generate.prompt", "a prompt is required"),
        ({"kind": "generate", "generate": {"prompt": "a fox", "steps": 1.5}}, "generate.steps", "must be an integer"),
        ({"generate": {"prompt": "x"}}, "generate", "only apply to generate jobs"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(config, fields, field, message):
    raw = {"kind": "load", "model": model(config), **fields}
    if raw["model"] == "MISSING":
        raw["model"] = model(config, "missing.safetensors")
    with pytest.raises(JobSpecError) as caught:
        build_spec(raw, config, known_kinds=("generate", "load"))
    assert caught.value.field == field
    assert message in str(caught.value)


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
    spec = build_spec({"kind": "generate", "model": str(tiny_model), "generate": {"prompt": "a fox", "frames": "9"}},
                      config)
    assert spec.generate.frames == 9 and spec.generate.prompt == "a fox"
    assert JobSpec.from_dict(get_job(db, enqueue(db, spec))["spec"]) == spec


def test_retry_queues_a_new_job_with_the_same_spec(db, config):
    first = submit(db, {"kind": "steps", "model": model(config)}, config)
    db.execute("UPDATE jobs SET status = 'failed' WHERE id = ?", [first])
    second = retry(db, first)
    assert get_job(db, second)["spec"] == get_job(db, first)["spec"]
    assert get_job(db, second)["retry_of"] == first and get_job(db, second)["status"] == "queued"


def test_two_supervisors_never_claim_the_same_job(db, config):
    spec = build_spec({"kind": "steps", "model": model(config)}, config)
    ids = [enqueue(db, spec) for _ in range(60)]
    claimed: dict[str, list[int]] = {"a": [], "b": [], "c": []}

    def claim_all(name: str) -> None:
        own = connect(config.db_path)
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
