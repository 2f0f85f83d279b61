"""The Run page under AppTest: the loader's verdict before queueing, broken folders that never
take the page down, a form that remembers and fills from a job, and the forecast's wall."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from core.sizes import format_size
from streamlit.testing.v1 import AppTest

from jobs.kinds.generate import GenerateJobOptions
from jobs.kinds.load import LoadJobOptions
from jobs.spec import JobSpec
from storage import jobs_table
from storage.schema import FINAL_STATUSES

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60


def run_page() -> AppTest:
    return AppTest.from_file(str(ROOT / "dashboard" / "pages" / "run.py"), default_timeout=TIMEOUT)


def _labels(at: AppTest) -> list[str]:
    """The checkpoint picker's entries as the user reads them."""
    return list(at.selectbox(key="run_checkpoint").options)


def _queued(db) -> list[dict]:
    return [json.loads(row[0]) for row in db.execute("SELECT spec FROM jobs ORDER BY id").fetchall()]


def _add_spec(db, spec: JobSpec, status: str = "succeeded") -> int:
    job_id = jobs_table.enqueue(db, spec.kind, spec.to_dict())
    if status in FINAL_STATUSES:
        jobs_table.finish(db, job_id, status)
    return job_id


def test_a_truncated_shard_shows_the_loaders_message_in_red_and_cannot_be_queued(fresh_db, tiny_checkpoint):
    with open(tiny_checkpoint, "r+b") as f:
        f.truncate(tiny_checkpoint.stat().st_size - 1000)
    at = run_page().run()
    assert not at.exception, at.exception
    assert [label.split(" — ")[0] for label in _labels(at)] == ["✗ tiny.safetensors"]
    refusal = next(e.value for e in at.error if "The loader refuses" in e.value)
    # The loader's per-tensor lines folded into one sentence that says what to do.
    assert "tiny.safetensors is truncated (" in refusal and refusal.endswith("tensor cut off): copy it again")
    assert at.button(key="run_submit").disabled
    assert any("1 problem(s)" in m.value for m in at.markdown)


def test_a_sound_checkpoint_says_its_headers_are_valid(fresh_db, tiny_checkpoint):
    at = run_page().run()
    assert not any("The loader refuses" in e.value for e in at.error)
    assert any("headers valid" in e.label for e in at.expander)
    assert not at.button(key="run_submit").disabled


def test_a_deeply_nested_json_folder_is_listed_as_broken_and_the_page_still_queues(fresh_db, tiny_checkpoint, data_dir):
    deep = data_dir / "models" / "deep"
    deep.mkdir()
    (deep / "model_index.json").write_text("[" * 200_000 + "]" * 200_000)
    at = run_page().run()
    assert not at.exception, at.exception
    broken = [label for label in _labels(at) if label.startswith("✗ deep — broken: ")]
    assert len(broken) == 1, _labels(at)
    # The sound checkpoint is the default and queues.
    assert at.selectbox(key="run_checkpoint").value == str(tiny_checkpoint)
    at.button(key="run_submit").click().run()
    assert [spec["model"] for spec in _queued(fresh_db)] == [str(tiny_checkpoint)]


def test_a_link_out_of_the_model_roots_is_not_offered(fresh_db, tiny_checkpoint, data_dir, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "stolen.safetensors").write_bytes(tiny_checkpoint.read_bytes())
    (data_dir / "models" / "escape.safetensors").symlink_to(outside / "stolen.safetensors")
    (data_dir / "models" / "escape-dir").symlink_to(outside, target_is_directory=True)
    at = run_page().run()
    assert [label.split(" — ")[0] for label in _labels(at)] == ["tiny.safetensors"]


def test_clicking_the_selected_mode_keeps_it_selected(fresh_db, tiny_checkpoint):
    at = run_page().run()
    at.segmented_control(key="run_mode").set_value("drain").run()
    at.segmented_control(key="run_mode").set_value(None).run()
    assert at.segmented_control(key="run_mode").value == "drain"
    assert any(c.value.startswith("drain:") for c in at.caption)


def test_a_fresh_session_opens_the_form_the_url_describes(fresh_db, tiny_checkpoint):
    at = run_page()
    at.query_params["mode"] = "drain"
    at.query_params["kind"] = "generate"
    at.run()
    assert at.segmented_control(key="run_mode").value == "drain"
    assert at.segmented_control(key="run_kind").value == "generate"


def test_edit_and_requeue_fills_the_form_from_the_job_and_queues_the_same_spec(fresh_db, tiny_checkpoint):
    # stream: the one mode that applies drop_page_cache (the gone-checkpoint test below fills another mode).
    original = JobSpec(kind="load", model=str(tiny_checkpoint), mode="stream", dtype="float16", sample_every=4,
                       memory_budget=40 * 2**30, memory_floor=512 * 2**20, options=LoadJobOptions(drop_page_cache=True))
    job_id = _add_spec(fresh_db, original)
    at = run_page()
    at.query_params["from"] = str(job_id)
    at.run()
    assert not at.exception, at.exception
    assert any(f"Filled from job {job_id}" in i.value for i in at.info)
    assert at.selectbox(key="run_dtype").value == "float16"
    assert at.number_input(key="run_sample_every").value == 4
    assert (at.text_input(key="run_memory_budget").value, at.text_input(key="run_memory_floor").value) == ("40GiB", "512MiB")
    assert at.selectbox(key="run_drop_page_cache").value == "on"
    at.button(key="run_submit").click().run()
    queued = _queued(fresh_db)[-1]
    assert queued["forecast"]["refusal"] is None  # the submit check's forecast is stored with the spec
    assert queued["model_roots"] == [str(tiny_checkpoint.parent)]  # what the submit checked against
    assert {**queued, "forecast": None, "model_roots": []} == json.loads(json.dumps(original.to_dict()))


def test_edit_and_requeue_of_a_generate_job_fills_prompt_and_seed(fresh_db, tiny_checkpoint):
    from models.request.params import GenerateParams

    params = GenerateParams(prompt="a whale at dusk", seed=3, steps=4)
    job_id = _add_spec(fresh_db, JobSpec(kind="generate", model=str(tiny_checkpoint),
                                         options=GenerateJobOptions(generate=params, sequential_components=False)))
    at = run_page()
    at.query_params["from"] = str(job_id)
    at.run()
    assert at.segmented_control(key="run_kind").value == "generate"
    assert at.text_area(key="run_gen_prompt").value == "a whale at dusk"
    assert (at.number_input(key="run_gen_seed").value, at.number_input(key="run_gen_steps").value) == (3, 4)
    assert at.selectbox(key="run_sequential_components").value == "off"


@pytest.mark.parametrize("raw", ["²", "100000000000000000000000000000", "-3", "abc"])
def test_a_crafted_from_names_no_job_and_crashes_nothing(fresh_db, tiny_checkpoint, raw):
    at = run_page()
    at.query_params["from"] = raw
    at.run()
    assert not at.exception, at.exception
    assert any("is not a job id" in w.value and "The form keeps its values." in w.value for w in at.warning)


def test_the_forecast_honours_the_typed_memory_limit_and_counts_the_process_learned_from_past_loads(
        fresh_db, tiny_checkpoint):
    from machine.device import probe_device
    from models.forecast.eta import device_key
    from tests.jobs.test_verdict import past_job

    cpu = probe_device("cpu")
    # A past load on this machine whose process grew by 1.25 GiB before its first weight: a limit counts it.
    past_job(fresh_db, None, tiny_checkpoint, kind="load", device=device_key(cpu.kind, cpu.name),
             start_up=2**30 * 5 // 4)
    at = run_page().run()
    assert any(s.value.startswith("Fits: needs ") for s in at.success)
    limit = at.text_input(key="run_memory_limit")
    if limit.disabled:
        pytest.fail("per-job memory limits are not available here; this test needs a box with memory cgroups")
    limit.input("1GiB").run()
    refusal = next(e.value for e in at.error if e.value.startswith("Will not fit"))
    assert re.fullmatch(r"Will not fit: needs 1\.\d GiB, over the 1\.00 GiB memory limit \(anonymous memory; "
                        r"file-backed pages are reclaimable\): set the limit to at least that, or tick \*Queue "
                        r"anyway\*\.", refusal), refusal
    assert any("grows by 1.2 GiB before its first weight (median of 1 past job" in c.value for c in at.caption)


def test_the_forecast_honours_the_typed_memavailable_floor(fresh_db, tiny_checkpoint):
    from dashboard.host import read_host_memory

    at = run_page().run()
    at.text_input(key="run_memory_floor").input(f"{read_host_memory().total // 2**20}MiB").run()
    refusal = next(e.value for e in at.error if e.value.startswith("Will not fit"))
    assert "MemAvailable less the" in refusal and "free memory first" in refusal


def test_an_empty_floor_field_forecasts_with_the_configured_floor(fresh_db, tiny_checkpoint, monkeypatch):
    from dashboard.host import read_host_memory

    total = read_host_memory().total
    monkeypatch.setenv("DRAINBOARD_MEMORY_FLOOR", f"{total // 2**20}MiB")
    at = run_page().run()
    refusal = next(e.value for e in at.error if e.value.startswith("Will not fit"))
    assert f"less the {format_size(total // 2**20 * 2**20)} floor" in refusal


def test_requeue_of_a_job_whose_checkpoint_is_gone_says_so(fresh_db, tiny_checkpoint, data_dir):
    job_id = _add_spec(fresh_db, JobSpec(kind="load", model=str(data_dir / "models" / "gone"), mode="retain"))
    at = run_page()
    at.query_params["from"] = str(job_id)
    at.run()
    warning = next(w.value for w in at.warning if "tiny.safetensors is chosen instead" in w.value)
    assert "gone does not exist" in warning
    assert "DRAINBOARD_MODEL_ROOTS" in warning and "model_roots` in drainboard.toml" in warning
    assert at.selectbox(key="run_checkpoint").value == str(tiny_checkpoint)
    assert at.segmented_control(key="run_mode").value == "retain"


def test_a_refused_job_says_its_need_once_in_the_pages_words_and_queue_anyway_records_it(fresh_db, tiny_checkpoint):
    from dashboard.host import read_host_memory

    at = run_page().run()
    assert not any(e.value.startswith("Will not fit") for e in at.error)
    at.text_input(key="run_memory_floor").input(f"{read_host_memory().total // 2**20}MiB").run()
    said = [e.value for e in [*at.error, *at.warning, *at.caption] if "needs " in e.value]
    assert len(said) == 1 and said[0].startswith("Will not fit: needs ") and "--" not in said[0], said
    assert said[0].endswith(", or tick *Queue anyway*.")
    at.button(key="run_submit").click().run()
    assert _queued(fresh_db) == []
    assert any(e.value.startswith("Nothing was queued: it does not fit (see *Will it fit?*)") for e in at.error)
    assert len([e for e in [*at.error, *at.warning, *at.caption] if "needs " in e.value]) == 1  # still said once
    at.checkbox(key="run_forced").check().run()
    at.button(key="run_submit").click().run()
    [spec] = _queued(fresh_db)
    assert spec["forced"] is True
    assert spec["forecast"]["refusal"].startswith("refused: needs ") and "MemAvailable less the" in \
        spec["forecast"]["refusal"]


def chart_labels(at: AppTest) -> list[str]:
    """The `label` column of every dataset the page's Vega-Lite charts carry (Arrow, as Streamlit sends them)."""
    import pyarrow as pa

    labels: list[str] = []

    def walk(node) -> None:
        proto = getattr(node, "proto", None)
        for dataset in getattr(proto, "datasets", []):
            table = pa.ipc.open_stream(dataset.data.data).read_all()
            if "label" in table.column_names:
                labels.extend(str(v) for v in table.column("label").to_pylist())
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at._tree)
    return labels


def test_the_fit_bar_labels_the_limit_as_typed_not_where_it_sits_in_the_pool(fresh_db, tiny_checkpoint):
    at = run_page().run()
    limit = at.text_input(key="run_memory_limit")
    if limit.disabled:
        pytest.fail("per-job memory limits are not available here; this test needs a box with memory cgroups")
    limit.input("200MB").run()
    labels = chart_labels(at)
    assert "limit 191 MiB" in labels, labels
    assert not any(label.startswith("limit") and label != "limit 191 MiB" for label in labels), labels
    assert any("190.7 MiB memory limit" in m.value for m in [*at.error, *at.warning, *at.success])


def test_drain_on_a_unified_memory_gpu_warns_that_mmap_reads_are_slow_there(fresh_db, tiny_checkpoint, monkeypatch):
    """A faithful fake of a GB10 (no such device here): the Run page lists it, and picking drain (or retain)
    on it says mmap-staged reads are slow on unified memory; stream says nothing."""
    from dashboard import data
    from machine.device import DeviceInfo

    gb10 = DeviceInfo("cuda:0", "cuda", 0, "NVIDIA GB10", True, 121 * 2**30, "fake", "a made-up GB10")
    monkeypatch.setattr(data, "devices", lambda: [data.probe_device("cpu"), gb10])
    at = run_page().run()
    at.selectbox(key="run_device").set_value("cuda:0").run()
    assert not any("mmap" in w.value for w in at.warning)
    at.segmented_control(key="run_mode").set_value("drain").run()
    assert any("mmap" in w.value and "NVIDIA GB10" in w.value for w in at.warning)


def test_edit_and_requeue_brings_the_job_s_own_inputs_and_says_which_are_gone(fresh_db, tiny_checkpoint, data_dir,
                                                                              tmp_path):
    from PIL import Image

    from models.request.params import GenerateParams
    from storage.artifacts import job_dir

    gone = tmp_path / "upload.png"  # the user's file, long deleted: the job's copy is what is carried
    params = GenerateParams(prompt="a fox", workflow="fl2va", image=str(gone), last_image=str(gone))
    job_id = _add_spec(fresh_db, JobSpec(kind="generate", model=str(tiny_checkpoint),
                                         options=GenerateJobOptions(generate=params)))
    folder = job_dir(data_dir, job_id)
    folder.mkdir(parents=True)
    Image.new("RGB", (80, 48), (200, 30, 30)).save(folder / "image.png")  # last_image's copy is missing
    at = run_page()
    at.query_params["from"] = str(job_id)
    at.run()
    assert not at.exception, at.exception
    assert at.selectbox(key="run_gen_workflow").value == "fl2va"
    assert [c for image in at.get("image") for c in image.captions] == [f"image.png from job {job_id}"]
    assert any(f"Job {job_id}'s last_image is gone" in w.value and "upload it again" in w.value for w in at.warning)
    at.button(key="run_gen_remove_image").click().run()
    assert not at.get("image")


def _page_from_lora_job(fresh_db, checkpoint, folder, files: dict[str, dict[str, str]], loras: tuple, steps):
    """The Run page filled from a generate job at `steps` stacking `loras`; `files` (name -> its `__metadata__`) are
    written to `folder` under the model root first."""
    import torch
    from safetensors.torch import save_file

    from models.request.params import GenerateParams

    folder.mkdir()
    factors = {"transformer.proj_in.lora_A.weight": torch.ones(2, 96), "transformer.proj_in.lora_B.weight": torch.ones(64, 2)}
    for name, metadata in files.items():
        save_file(factors, str(folder / name), metadata=metadata or None)
    job_id = _add_spec(fresh_db, JobSpec(kind="generate", model=str(checkpoint), options=GenerateJobOptions(
        generate=GenerateParams(prompt="a fox", steps=steps, loras=loras))))
    at = run_page()
    at.query_params["from"] = str(job_id)
    at.run()
    assert not at.exception, at.exception
    return at


def test_loras_under_the_roots_are_offered_with_a_strength_and_edit_and_requeue_brings_them_back(
        fresh_db, tiny_checkpoint, data_dir):
    folder = data_dir / "models" / "loras"
    loras = ({"file": str(folder / "style.safetensors"), "scale": 0.6, "sha256": "ab" * 32, "partition": "transformer"},
             {"file": str(folder / "turbo.safetensors"), "scale": 1.0, "sha256": "cd" * 32, "partition": "transformer"})
    at = _page_from_lora_job(fresh_db, tiny_checkpoint, folder, {"turbo.safetensors": {"num_inference_steps": "8"},
                                                                 "style.safetensors": {}}, loras, 50)
    picker = at.multiselect(key="run_gen_loras")
    assert sorted(o.split(" (")[0] for o in picker.options) == ["style.safetensors", "turbo.safetensors"]
    assert picker.value == [loras[0]["file"], loras[1]["file"]]  # stacked in the job's order
    assert at.number_input(key=f"run_gen_lora_scale:{loras[0]['file']}").value == 0.6
    [warning] = [w.value for w in at.warning if "distilled for 8 steps" in w.value]
    assert warning.startswith("'turbo.safetensors' says it was distilled for 8 steps; 50 steps run 49")
    at.number_input(key="run_gen_steps").set_value(8).run()
    assert not [w for w in at.warning if "distilled for" in w.value]  # run at its own steps: nothing to say


def test_the_few_step_warning_reads_the_metadata_never_the_name_and_an_unset_steps_runs_at_the_stated_ones(
        fresh_db, tiny_checkpoint, data_dir):
    folder = data_dir / "models" / "loras"
    named = "lightx2v-4step-distill.safetensors"  # says it is few-step in its name alone
    loras = tuple({"file": str(folder / name), "scale": 1.0} for name in (named, "turbo.safetensors"))
    at = _page_from_lora_job(fresh_db, tiny_checkpoint, folder, {"turbo.safetensors": {"steps": "8"}, named: {}},
                             loras, None)
    assert at.number_input(key="run_gen_steps").value is None
    assert not [w for w in at.warning if "distilled for" in w.value]  # unset: the job takes turbo's 8 steps
    at.number_input(key="run_gen_steps").set_value(50).run()
    assert [w.value.split(" says")[0] for w in at.warning if "distilled for" in w.value] == ["'turbo.safetensors'"]


def test_a_lora_files_name_reaches_the_run_page_quoted(fresh_db, tiny_checkpoint, data_dir):
    folder = data_dir / "models" / "loras"
    name = "turbo\x1b[2J\nFORGED.safetensors"  # clears a terminal, forges a line
    loras = ({"file": str(folder / name), "scale": 1.0},)
    at = _page_from_lora_job(fresh_db, tiny_checkpoint, folder, {name: {"steps": "8"}}, loras, 50)
    [option] = at.multiselect(key="run_gen_loras").options
    strength = at.number_input(key=f"run_gen_lora_scale:{folder / name}")
    [warning] = [w.value for w in at.warning if "distilled for" in w.value]
    for shown in (option, strength.label, warning):
        assert "turbo\\x1b[2J\\nFORGED.safetensors" in shown and "\x1b" not in shown and "\n" not in shown


def test_an_edited_jobs_lora_that_is_gone_is_said_not_dropped_in_silence(fresh_db, tiny_checkpoint, data_dir):
    folder = data_dir / "models" / "loras"
    loras = ({"file": str(folder / "deleted.safetensors"), "scale": 0.5},
             {"file": str(folder / "style.safetensors"), "scale": 1.0})
    at = _page_from_lora_job(fresh_db, tiny_checkpoint, folder, {"style.safetensors": {}}, loras, 8)
    assert at.multiselect(key="run_gen_loras").value == [loras[1]["file"]]
    [warning] = [w.value for w in at.warning if "deleted.safetensors" in w.value]
    assert warning.startswith(f"LoRA {folder / 'deleted.safetensors'} is not among the LoRA files under the model roots")
