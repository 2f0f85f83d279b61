"""A job's parameters as every page shows them, and job ids from crafted query parameters."""

from __future__ import annotations

import pytest

from dashboard.views.query import MAX_JOB_ID, QueryError, job_id, job_ids
from dashboard.views.spec import checkpoint_key, job_label, job_parameters

GIB = 2**30


@pytest.mark.parametrize("raw", ["²", "3²", "-1", "0", "1.5", "abc", "100000000000000000000000000000", str(MAX_JOB_ID + 1), "٣"])
def test_anything_but_a_job_id_is_refused_with_what_was_expected(raw):
    with pytest.raises(QueryError, match="is not a job id"):
        job_id(raw)


def test_job_ids_are_ascii_digits_up_to_sqlites_largest_integer():
    assert job_id(" 42 ") == 42
    assert job_id(str(MAX_JOB_ID)) == MAX_JOB_ID
    assert job_ids("3,5,3,,7") == [3, 5, 7]


def test_every_bad_part_of_a_job_list_is_named():
    with pytest.raises(QueryError) as caught:
        job_ids("²,3,x")
    assert str(caught.value) == "?jobs=: '²', 'x' are not job ids; expected whole numbers separated by commas, such as ?jobs=3,5"


def _generate_job() -> dict:
    return {
        "id": 7, "kind": "generate",
        "spec": {"kind": "generate", "model": "/models/demo", "component": None, "mode": "drain", "device": "cpu",
                 "dtype": "bfloat16", "memory_limit": 3 * GIB, "memory_budget": None, "gpus": 1,
                 "offload": {"dit_cpu_offload": True, "vae_cpu_offload": False},
                 "generate": {"prompt": "a whale at dusk", "negative_prompt": "", "frames": 25, "height": 112, "width": 192,
                              "steps": 6, "guidance_scale": 4.0, "seed": 3, "fps": 24, "audio": True}},
    }


def test_a_generate_jobs_parameters_read_in_full():
    params = job_parameters(_generate_job())
    assert params["prompt"] == "a whale at dusk"
    assert params["seed"] == "3"
    assert params["frames"] == "25 (1.04 s at 24 fps)"
    assert params["size"] == "192 × 112 px"
    assert params["steps"] == "6 steps = 5 transformer passes" and "guidance" not in params
    assert (params["mode"], params["device"], params["dtype"]) == ("drain", "cpu", "bfloat16")
    assert (params["memory limit"], params["memory budget"]) == ("3.00 GiB", "none")
    # On the CPU nothing is offloaded: the flags as asked are not what ran.
    assert params["offload"] == "does not apply: everything runs on the CPU"
    on_gpu = job_parameters({**_generate_job(), "spec": {**_generate_job()["spec"], "device": "cuda:0"}})
    assert (on_gpu["transformer kept on the CPU between passes"], on_gpu["video decoder kept on the CPU between uses"]) == ("on", "off")
    assert list(params)[:4] == ["kind", "checkpoint", "component", "mode"]


def test_a_loads_parameters_have_no_generate_fields():
    load = {"id": 2, "kind": "load", "spec": {"model": "/models/demo", "component": "transformer", "mode": "stream"}}
    params = job_parameters(load)
    assert params["component"] == "transformer" and "prompt" not in params and "seed" not in params


def test_labels_and_checkpoint_keys():
    job = _generate_job()
    assert job_label(job) == "#7 t2va drain"  # a generate by its workflow
    fl2va = {**job, "spec": {**job["spec"], "generate": {**job["spec"]["generate"], "workflow": "fl2va"}}}
    assert job_label(fl2va) == "#7 fl2va drain"
    assert checkpoint_key(job) == ("/models/demo", None, "generate")


@pytest.mark.parametrize("name", ["job", "from"])
def test_an_id_of_thousands_of_digits_is_one_bounded_message(name):
    raw = "9" * 4301  # past Python's int-string limit: int() itself raises
    with pytest.raises(QueryError, match="job ids run from 1 to") as caught:
        job_id(raw, name=name)
    assert len(str(caught.value)) < 200 and "4,301 characters" in str(caught.value)
    assert job_id("0" * 30 + "7", name=name) == 7  # leading zeros are no reason to refuse


def test_a_crafted_job_list_is_quoted_bounded():
    with pytest.raises(QueryError) as caught:
        job_ids(",".join(["9" * 4301] * 500))
    assert len(str(caught.value)) < 400 and "and 497 more" in str(caught.value)


def test_a_load_says_how_its_ring_held_its_staging_and_why():
    """The ring's staging path from the load report (`ring_staging`): a GB10 refuses host registration, so
    the Parameters tab shows the fallback it took, in words, with the reason."""
    job = {"kind": "load", "spec": {"kind": "load", "model": "/m", "device": "cuda:0"},
           "metrics": {"ring_staging": "torch-pinned", "ring_staging_note": "cuMemHostRegister: not supported"}}
    row = job_parameters(job)["host staging (ran)"]
    assert row.startswith("pinned host memory from torch's allocator") and row.endswith("cuMemHostRegister: not supported")
    assert "host staging (ran)" not in job_parameters({**job, "metrics": {}})


def test_a_generate_jobs_workflow_inputs_and_knobs_are_among_its_parameters():
    job = _generate_job()
    old = job_parameters(job)  # a spec from before the knobs: what it ran with, the defaults
    assert (old["workflow"], old["input images"], old["VAE tiling"], old["VAE precision"], old["transformer weights"]) == \
        ("t2va", "none (text only)", "on", "bf16", "not quantized")
    job["spec"]["generate"] |= {"image": "/data/uploads/0a1b.png", "last_image": "/data/uploads/2c3d.png",
                                "vae_tiling": False, "vae_dtype": "fp32", "quantize": "int8"}
    params = job_parameters(job)
    assert (params["workflow"], params["input images"], params["VAE tiling"], params["VAE precision"],
            params["transformer weights"]) == ("fl2va", "first frame, last frame", "off", "fp32", "int8 (weight-only)")
    assert old["speed levers"] == "none"
    job["spec"]["generate"] |= {"attention": "_native_cudnn", "compile": True, "step_cache": "taylorseer"}
    assert job_parameters(job)["speed levers"] == ("cuDNN attention (lossless), regional compile (lossless), "
                                                   "TaylorSeer step cache (lossy)")
    assert old["plan"] == "none"
    job["spec"] |= {"plan": "fastest", "planned": {"chosen": 0, "why": "no history", "candidates": [
        {"label": "resident · bf16 · regional compile"}]}}
    assert job_parameters(job)["plan"] == "fastest: resident · bf16 · regional compile (no history)"
    assert old["GPUs"] == "1 (one process)"
    job["spec"]["generate"]["parallel"] = 2
    assert job_parameters(job)["GPUs"].startswith("2 ranks, one GPU each (diffusers' context parallelism")


def test_history_puts_each_input_images_thumbnail_in_its_own_column():
    from dashboard.views.history import history_frame

    job = _generate_job() | {"status": "succeeded", "retry_of": None}
    job["spec"]["generate"] |= {"ref_image": "/data/uploads/ab.png", "quantize": "fp8"}
    frame = history_frame([job], {}, link=str, inputs={7: {"ref_image": "data:image/png;base64,AAAA"}})
    row = frame.iloc[0]
    assert row["reference image"] == "data:image/png;base64,AAAA" and row["first frame"] == ""  # never drawn "None"
    assert (row["workflow"], row["transformer weights"]) == ("ref2va", "fp8 (weight-only)")
    assert row["LoRAs"] == "none"


def test_a_generate_jobs_loras_read_the_same_on_the_job_page_history_and_compare():
    from dashboard.views.history import comparison_table, history_frame

    job = _generate_job() | {"status": "succeeded", "retry_of": None, "started_at": 100.0, "finished_at": 140.0}
    job["spec"]["generate"]["loras"] = [
        {"file": "/models/loras/turbo-8step.safetensors", "scale": 1.0, "sha256": "ab" * 32, "partition": "transformer"},
        {"file": "/models/loras/" + "x" * 300 + ".safetensors", "scale": 0.6, "sha256": None, "partition": None}]
    words = job_parameters(job)["LoRAs"]
    assert words.startswith("'turbo-8step.safetensors' x 1 into transformer (sha256 abababababab); 'xxx")
    assert "x 0.6 into the workflow transformer" in words and len(words) < 200  # a crafted name is quoted bounded
    assert history_frame([job], {}, link=str).iloc[0]["LoRAs"] == words
    other = {**job, "id": 8, "spec": {**job["spec"], "generate": {**job["spec"]["generate"], "loras": []}}}
    table = comparison_table([job, other], {}, 7)
    assert list(table["LoRAs"]) == [words, "none"]


def test_compare_gives_generate_jobs_their_memory_and_time_not_a_row_of_dashes():
    from dashboard.views.history import comparison_table

    jobs = []
    for job_id, peak, seconds in ((7, 3 * GIB, 40.0), (8, 3 * GIB // 2, 60.0)):
        job = _generate_job() | {"id": job_id, "status": "succeeded", "started_at": 100.0,
                                 "finished_at": 100.0 + seconds, "progress_done": 5}
        job["metrics"] = {"peak_footprint": peak, "stage_seconds": {"denoise.denoise": seconds / 2}}
        jobs.append(job)
    table = comparison_table(jobs, {}, 7).set_index("job")
    assert list(table.loc["#8", ["peak footprint", "peak footprint vs ref", "job time", "job time vs ref",
                                 "time per pass", "time per pass vs ref"]]) == [
        "1.50 GiB", "0.50×", "1 min 00 s", "1.50×", "6.00 s", "1.50×"]
    assert "footprint" not in table.columns and "load time" not in table.columns  # a load's figures, not a generate's


def test_compare_gives_a_cached_job_its_passes_computed_and_reused_beside_the_exact_run():
    from dashboard.views.history import comparison_table

    jobs = []
    for job_id, computed, reused in ((7, 19, 0), (8, 9, 10)):
        job = _generate_job() | {"id": job_id, "status": "succeeded", "started_at": 100.0, "finished_at": 140.0}
        job["metrics"] = {"steps": 19, "steps_computed": computed, "steps_reused": reused}
        jobs.append(job)
    old = _generate_job() | {"id": 9, "status": "succeeded", "metrics": {"steps": 19}}  # from before they were counted
    table = comparison_table([*jobs, old], {}, 7).set_index("job")
    assert list(table.loc["#8", ["passes computed", "passes computed vs ref", "passes reused"]]) == ["9", "0.47×", "10"]
    assert list(table.loc["#7 (ref)", ["passes computed", "passes reused"]]) == ["19", "0"]
    assert list(table.loc["#9", ["passes computed", "passes reused"]]) == ["—", "—"]
