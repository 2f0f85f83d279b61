"""Each page runs standalone under AppTest (st.navigation is app.py's job)."""

from __future__ import annotations

from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from storage import jobs_table
from storage.queries import delete_job

PAGES = ["run", "job", "history", "compare", "models", "system"]
TIMEOUT = 60
ROOT = Path(__file__).resolve().parents[2]


def page(name: str) -> AppTest:
    return AppTest.from_file(str(ROOT / "dashboard" / "pages" / f"{name}.py"), default_timeout=TIMEOUT)


def _text(at: AppTest) -> str:
    parts = []
    for kind in ("markdown", "caption", "info", "warning", "error", "success", "title", "subheader", "metric"):
        for element in getattr(at, kind):
            parts.append(str(getattr(element, "value", "")) + " " + str(getattr(element, "label", "")))
    return "\n".join(parts)


def _frame_with(at: AppTest, column: str):
    """The one dataframe on the page that has `column`."""
    (frame,) = [df.value for df in at.dataframe if column in df.value.columns]
    return frame


@pytest.mark.parametrize("name", PAGES)
def test_every_page_runs_on_an_empty_box(name, fresh_db):
    at = page(name).run()
    assert not at.exception, at.exception


@pytest.fixture
def db_with_jobs(fresh_db, job_adder, load_samples, tiny_checkpoint):
    """Three finished loads of a 2 GiB checkpoint (retain, drain, stream) and one killed retain,
    all naming tiny_checkpoint as their model so a retry validates."""
    ids = {}
    model = str(tiny_checkpoint)
    for mode, ratio in (("retain", 2.0), ("drain", 1.16), ("stream", 1.0)):
        ids[mode] = job_adder(
            fresh_db, status="succeeded", mode=mode, samples=load_samples, model=model,
            metrics={"bytes_placed": 2 * 2**30, "footprint_ratio": ratio, "load_seconds": 12.0, "throughput_gbps": 0.18},
        )
    ids["killed"] = job_adder(
        fresh_db, status="killed", mode="retain", samples=load_samples.iloc[:40], signal="SIGKILL", model=model,
        error=KILL_CAUSE,
    )
    return fresh_db, ids


KILL_CAUSE = (
    "killed (SIGKILL) by the kernel OOM killer in the job's memory cgroup: limit 1.00 GiB reached (cgroup oom_kill "
    "count 1); last sample at 3.9 s: stage load, tensor 40 of 96 (transformer_blocks.39.attn.to_q.weight), "
    "VmRSS 1.08 GiB, MemAvailable 19.2 GiB"
)
"""How the supervisor words an OOM kill in a memory cgroup (jobs/supervisor.py)."""


@pytest.mark.parametrize("name", PAGES)
def test_every_page_runs_with_finished_and_killed_jobs(name, db_with_jobs):
    at = page(name).run()
    assert not at.exception, at.exception


def test_job_page_shows_metrics_of_a_finished_load(db_with_jobs):
    _, ids = db_with_jobs
    at = page("job")
    at.query_params["job"] = str(ids["drain"])
    at.run()
    assert not at.exception, at.exception
    labels = {m.label: m.value for m in at.metric}
    assert labels["Footprint ratio"] == "1.16×"
    assert labels["Placed"] == "2.0 GiB"
    metrics = _frame_with(at, "metric").set_index("metric")
    assert metrics.loc["Footprint ratio", "value"] == "1.16×"
    assert metrics.loc["Throughput", "value"] == "0.18 GB/s"
    assert list(metrics.columns) == ["value"]
    assert "Job " + str(ids["drain"]) in _text(at)


def test_killed_job_says_where_it_died_and_offers_retry(db_with_jobs):
    db, ids = db_with_jobs
    at = page("job")
    at.query_params["job"] = str(ids["killed"])
    at.run()
    assert not at.exception, at.exception
    banner = at.error[0].value
    # The samples passed the (tiny) checkpoint's size, so no share of it is claimed: bytes only.
    assert banner.startswith("**Killed (SIGKILL) by the OOM killer at 853 MiB placed · t = 3.90 s**")
    # One sentence, then what to do: the smallest limit that would have worked, from the memory measured.
    assert "It needed more than its 1.0 GiB memory limit: retry with a limit of 1.5 GiB" in banner
    # The whole cause, in the supervisor's words, on demand: who, the limit, and the last sample.
    details = "\n".join(m.value for m in at.markdown)
    assert "limit 1.00 GiB reached" in details
    assert "Last sample at 3.9 s: while loading, tensor 40 of 96" in details
    assert at.table[0].value.loc["tensors placed", "value"] == "40"
    # A retain load killed at its limit: a retry with a limit that would have worked (never the same
    # settings, killed again) and the cheaper modes.
    assert [b.label for b in at.button if b.label.startswith("Retry")] == [
        "Retry with a limit of 1.5 GiB", "Retry with stream", "Retry with drain"]
    retry = next(b for b in at.button if b.label == "Retry with stream")
    retry.click().run()
    newest = db.execute("SELECT id, spec, retry_of FROM jobs ORDER BY id DESC LIMIT 1").fetchone()
    assert newest[2] == ids["killed"]
    assert '"mode": "stream"' in newest[1]


def test_history_lists_every_job_and_compare_takes_the_selection(db_with_jobs):
    _, ids = db_with_jobs
    at = page("history").run()
    table = at.dataframe[0].value
    assert sorted(table["id"]) == sorted(ids.values())
    assert at.button[0].label.startswith("Compare (0)") and at.button[0].disabled


def test_compare_overlays_the_jobs_from_the_query(db_with_jobs):
    _, ids = db_with_jobs
    at = page("compare")
    at.query_params["jobs"] = f"{ids['retain']},{ids['stream']}"
    at.run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert list(table["job"]) == [f"#{ids['retain']} (ref)", f"#{ids['stream']}"]
    assert list(table["footprint vs ref"]) == ["1.00×", "0.50×"]


def test_run_page_queues_a_valid_load_and_goes_to_its_job_page(fresh_db, tiny_checkpoint):
    at = page("run").run()
    assert not at.exception, at.exception
    at.button(key="run_submit").click().run()
    assert not at.exception, at.exception
    rows = fresh_db.execute("SELECT id, kind, spec FROM jobs").fetchall()
    assert len(rows) == 1 and rows[0][1] == "load"
    assert str(tiny_checkpoint) in rows[0][2]
    assert at.session_state["navigated_to"] == ("job", {"job": str(rows[0][0])})


def test_run_page_shows_the_validation_message_and_queues_nothing(fresh_db, tiny_checkpoint):
    at = page("run").run()
    at.text_input(key="run_memory_limit").set_value("lots")
    at.button(key="run_submit").click().run()
    assert not at.exception, at.exception
    assert fresh_db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    messages = [e.value for e in at.error]
    assert any("'lots' is not a size" in m for m in messages), messages


def test_run_page_previews_the_offload_policy_for_the_chosen_device(fresh_db, tiny_checkpoint):
    at = page("run").run()
    preview = next(df.value for df in at.dataframe if "setting" in df.value.columns)
    row = preview.set_index("setting").loc["transformer kept on the CPU between passes"]
    assert bool(row["requested"]) is True and bool(row["used"]) is False
    assert "CPU" in row["why"]


def _chart_specs(at: AppTest) -> list[dict]:
    import json

    return [json.loads(chart.proto.spec) for chart in at.get("vega_lite_chart")]


def test_compare_of_loads_opens_on_footprint_above_each_jobs_start(db_with_jobs):
    _, ids = db_with_jobs
    at = page("compare")
    at.query_params["jobs"] = f"{ids['retain']},{ids['drain']},{ids['stream']}"
    at.run()
    assert not at.exception, at.exception
    assert at.segmented_control(key="compare_y").value == "× checkpoint"
    assert at.toggle(key="compare_subtract").value is True
    assert any("× checkpoint size" in str(spec) for spec in _chart_specs(at))
    # One click back to absolute GiB.
    at.segmented_control(key="compare_y").set_value("GiB").run()
    assert not any("× checkpoint size" in str(spec) for spec in _chart_specs(at))


def _memory_layers(at: AppTest) -> list[dict]:
    """The unit layers of the Job page's memory chart (the one with a stage strip)."""
    spec = next(s for s in _chart_specs(at) if any(l.get("mark", {}).get("type") == "line" for l in s.get("layer", [])))
    return [l for l in spec["layer"] if "mark" in l]


def _y_titles(at: AppTest) -> list[str]:
    return [l["encoding"]["y"]["title"] for l in _memory_layers(at) if l["mark"]["type"] == "line" and "title" in l["encoding"].get("y", {})]


def _has_model_diagonal(at: AppTest) -> bool:
    return any(l["mark"]["type"] == "line" and l["mark"].get("strokeDash") == [2, 3] for l in _memory_layers(at))


def test_job_page_of_a_load_opens_above_baseline_with_the_model_diagonal(db_with_jobs):
    _, ids = db_with_jobs
    at = page("job")
    at.query_params["job"] = str(ids["drain"])
    at.run()
    assert not at.exception, at.exception
    assert at.segmented_control(key="job_fit").value == "Above baseline"
    assert _y_titles(at) == ["GiB above the job's first sample"]
    assert _has_model_diagonal(at)
    at.segmented_control(key="job_fit").set_value("Fit data").run()
    assert _y_titles(at) == ["GiB"]
    assert not _has_model_diagonal(at)


def test_job_page_of_a_generate_job_shows_steps_and_peak_footprint_not_placement(db_with_jobs, job_adder, load_samples):
    db, _ = db_with_jobs
    metrics = {"peak_footprint": 3 * 2**29, "stage_peaks": {"text_encoder": 3 * 2**29, "denoise.denoise": 2**30},
               "stage_seconds": {"denoise.denoise": 6.0}}
    job_id = job_adder(db, status="succeeded", kind="generate", samples=load_samples, metrics=metrics)
    jobs_table.set_progress(db, job_id, 6, 6)
    at = page("job")
    at.query_params["job"] = str(job_id)
    at.run()
    assert not at.exception, at.exception
    cards = {m.label: m for m in at.metric}
    assert "Placed" not in cards and "Footprint ratio" not in cards
    assert cards["Transformer passes"].value == "6/6"
    assert cards["Peak footprint"].value == "1.5 GiB"
    assert set(cards) == {"Transformer passes", "Peak in use", "Peak footprint", "Min headroom", "Peak VmRSS"}


@pytest.mark.parametrize("raw", ["²", "100000000000000000000000000000", "abc", "-3"])
def test_a_crafted_job_id_gets_a_message_not_a_crash(db_with_jobs, raw):
    at = page("job")
    at.query_params["job"] = raw
    at.run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error] == [f"?job={raw!r} is not a job id: " + (
        "job ids run from 1 to 9223372036854775807" if raw.isascii() and raw.lstrip("-").isdigit() and raw != "-3"
        else "expected a whole number such as ?job=3")]


def test_an_unknown_job_id_is_named(db_with_jobs):
    at = page("job")
    at.query_params["job"] = "999"
    at.run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error] == ["There is no job 999."]


def test_compare_with_a_crafted_job_list_says_what_is_wrong(db_with_jobs):
    _, ids = db_with_jobs
    at = page("compare")
    at.query_params["jobs"] = f"²,{ids['drain']}"
    at.run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error] == [
        "?jobs=: '²' is not a job id; expected whole numbers separated by commas, such as ?jobs=3,5"]


GENERATE = {"prompt": "a red fox running through fresh snow", "seed": 11, "steps": 4, "frames": 17, "guidance_scale": 3.5}
LOADS = {"transformer": {"mode": "stream", "device": "cpu", "tensors_placed": 41, "bytes_placed": 3 * 2**29,
                         "load_seconds": 2.0, "throughput_gbps": 0.81, "footprint_ratio": 1.01}}


def test_a_generate_jobs_page_shows_its_prompt_seed_and_component_loads(db_with_jobs, job_adder, load_samples):
    db, _ = db_with_jobs
    job_id = job_adder(db, status="succeeded", kind="generate", samples=load_samples, generate=GENERATE,
                       metrics={"peak_footprint": 2**30, "loads": LOADS})
    at = page("job")
    at.query_params["job"] = str(job_id)
    at.run()
    assert not at.exception, at.exception
    params = at.table[0].value["value"].to_dict()
    assert params["prompt"] == GENERATE["prompt"]
    assert f"**Prompt:** {GENERATE['prompt']}" in _text(at)
    assert (params["seed"], params["steps"]) == ("11", "4 steps = 3 transformer passes")
    assert "guidance" not in params  # fixed by the model: not a parameter of the job
    loads = _frame_with(at, "component").set_index("component")
    assert loads.loc["transformer", "throughput"] == "0.81 GB/s"
    # A generate job has only the seconds view: no empty "placed" axis.
    assert at.segmented_control(key="job_x").options == ["seconds"]


def test_a_failed_job_shows_its_whole_error_and_reads_failed(db_with_jobs, job_adder, load_samples):
    db, _ = db_with_jobs
    lines = [f"  transformer/diffusion_pytorch_model-0000{i}.safetensors: truncated" for i in range(1, 9)]
    error = "CheckpointError: 8 problems:\n" + "\n".join(lines)
    job_id = job_adder(db, status="failed", samples=load_samples.iloc[:5], error=error)
    at = page("job")
    at.query_params["job"] = str(job_id)
    at.run()
    assert not at.exception, at.exception
    assert at.error[0].value.startswith("**Failed at")
    shown = [m.value for m in at.markdown]
    assert all(f"- {line.strip()}" in shown for line in lines)  # every line, in the expander
    assert not any("CheckpointError" in m for m in shown)
    cards = {m.label: m.value for m in at.metric}
    assert cards["Footprint ratio"] != "— (killed)"
    assert [b.label for b in at.button if b.label.startswith("Retry")] == ["Retry with same settings"]


def test_a_cancelled_job_is_not_an_error_and_offers_no_mode_change(db_with_jobs, job_adder, load_samples):
    db, _ = db_with_jobs
    job_id = job_adder(db, status="cancelled", mode="retain", samples=load_samples.iloc[:30],
                       error="cancelled while running (SIGTERM)")
    at = page("job")
    at.query_params["job"] = str(job_id)
    at.run()
    assert not at.exception, at.exception
    assert not at.error
    assert at.info[0].value.startswith("**Cancelled by the user at")
    assert [b.label for b in at.button if b.label.startswith("Retry")] == ["Retry with same settings"]


def test_edit_and_requeue_opens_the_run_form_from_this_job(db_with_jobs):
    _, ids = db_with_jobs
    at = page("job")
    at.query_params["job"] = str(ids["drain"])
    at.run()
    at.button(key="job_edit").click().run()
    assert at.session_state["navigated_to"] == ("run", {"from": str(ids["drain"])})


def test_a_retry_and_its_original_link_to_each_other(db_with_jobs, job_adder, load_samples):
    db, ids = db_with_jobs
    retry = job_adder(db, status="succeeded", mode="stream", samples=load_samples, retry_of=ids["killed"])
    at = page("job")
    at.query_params["job"] = str(retry)
    at.run()
    assert f"Retry of [job {ids['killed']}](/job?job={ids['killed']})" in _text(at)
    at = page("job")
    at.query_params["job"] = str(ids["killed"])
    at.run()
    assert f"Retried as [job {retry}](/job?job={retry})" in _text(at)


def test_the_worker_log_is_offered_for_download(db_with_jobs, data_dir):
    db, ids = db_with_jobs
    from storage.artifacts import new_artifact_path, record_artifact

    log = new_artifact_path(data_dir, ids["killed"], "child", ".log")
    log.write_text("Traceback ...\n")
    record_artifact(db, data_dir, ids["killed"], log)
    at = page("job")
    at.query_params["job"] = str(ids["killed"])
    at.run()
    assert not at.exception, at.exception
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Worker log (child.log, 14 B)" in labels


@pytest.mark.parametrize("name", PAGES)
def test_no_page_names_an_internal_document(name, db_with_jobs):
    at = page(name).run()
    shown = _text(at) + "".join(str(df.value.columns.tolist()) + df.value.to_string() for df in at.dataframe)
    for internal in ("DESIGN", "UX.md", "STYLE.md"):
        assert internal not in shown


def test_history_has_a_chip_for_every_status_and_keeps_it_in_the_url(db_with_jobs, job_adder):
    db, ids = db_with_jobs
    job_adder(db, status="cancelled", error="cancelled while running (SIGTERM)")
    job_adder(db, status="queued")
    at = page("history").run()
    chips = at.segmented_control(key="status")
    assert chips.options == ["All", "Queued", "Running", "Succeeded", "Failed", "Killed", "Cancelled", "Interrupted"]
    assert "1 queued · 3 succeeded · 1 killed · 1 cancelled" in _text(at)
    at = page("history")
    at.query_params["status"] = "Killed"
    at.run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert list(table["id"]) == [ids["killed"]]
    # The cause is whole, not cut to a few characters, in words (no internal stage name).
    assert table["outcome"].iloc[0] == "killed: " + KILL_CAUSE.replace("stage load", "while loading")
    assert table["status"].iloc[0] == "✕ killed"  # the word beside the glyph, and its colour


def test_a_history_search_with_no_match_says_so(db_with_jobs):
    at = page("history")
    at.query_params["q"] = "no-such-checkpoint"
    at.run()
    assert not at.exception, at.exception
    assert any(i.value == "No job matches these filters and search." for i in at.info)


def test_history_searches_checkpoint_and_prompt(db_with_jobs, job_adder, load_samples):
    db, ids = db_with_jobs
    fox = job_adder(db, status="succeeded", kind="generate", model="/models/demo", samples=load_samples, generate=GENERATE)
    at = page("history")
    at.query_params["q"] = "FOX"
    at.run()
    table = at.dataframe[0].value
    assert list(table["id"]) == [fox]
    assert (table["prompt"].iloc[0], table["seed"].iloc[0], table["steps"].iloc[0]) == (GENERATE["prompt"], "11", "4 steps = 3 transformer passes")
    at.text_input(key="q").set_value("tiny").run()
    assert sorted(at.dataframe[0].value["id"]) == sorted(ids.values())


def test_history_deletes_the_selected_finished_jobs_after_confirmation(db_with_jobs, data_dir):
    db, ids = db_with_jobs
    from storage.artifacts import new_artifact_path, record_artifact

    video = new_artifact_path(data_dir, ids["retain"], "video", ".mp4")
    video.write_bytes(b"v" * 3 * 2**20)
    record_artifact(db, data_dir, ids["retain"], video)
    at = page("history").run()
    rows = list(at.dataframe[0].value["id"])
    at.session_state["history_table"] = {"selection": {"rows": [rows.index(ids["retain"]), rows.index(ids["killed"])], "columns": []}}
    at.run()
    at.button(key="history_delete_button").click().run()
    assert "removes 160 samples and 3 MiB of files" in at.warning[0].value
    at.button(key="history_confirm_delete").click().run()
    assert not at.exception, at.exception
    assert at.success[0].value == "Deleted 2 job(s): 3 MiB of files and 160 samples reclaimed."
    left = [r[0] for r in db.execute("SELECT id FROM jobs ORDER BY id")]
    assert left == [ids["drain"], ids["stream"]]
    assert not video.exists()


def test_compare_suggests_only_jobs_of_one_checkpoint(db_with_jobs, job_adder, load_samples, tmp_path):
    db, ids = db_with_jobs
    other = job_adder(db, status="succeeded", mode="drain", model="/models/other", samples=load_samples)
    at = page("compare").run()
    assert not at.exception, at.exception
    # The newest succeeded job is of /models/other, alone in its checkpoint: nothing to pair it with.
    assert at.multiselect[0].value == [other]
    delete_job(db, tmp_path, other)
    st.cache_data.clear()
    at = page("compare").run()
    assert at.multiselect[0].value == [ids["retain"], ids["drain"], ids["stream"]]


def test_compare_says_when_checkpoints_differ_and_gives_no_ratio_across_them(db_with_jobs, job_adder, load_samples):
    db, ids = db_with_jobs
    other = job_adder(db, status="succeeded", mode="drain", model="/models/other", samples=load_samples,
                      metrics={"footprint_ratio": 1.2})
    at = page("compare")
    at.query_params["jobs"] = f"{ids['stream']},{other}"
    at.run()
    assert not at.exception, at.exception
    assert at.warning[0].value.startswith("Different checkpoints or job kinds: tiny.safetensors (load), other (load)")
    table = at.dataframe[0].value.set_index("job")
    assert table.loc[f"#{other}", "footprint vs ref"] == "different checkpoint"


def test_compare_diff_only_covers_parameters_too(db_with_jobs, job_adder, load_samples):
    db, _ = db_with_jobs
    a = job_adder(db, status="succeeded", kind="generate", samples=load_samples, generate=GENERATE)
    b = job_adder(db, status="succeeded", kind="generate", samples=load_samples, generate={**GENERATE, "prompt": "a whale at dusk"})
    at = page("compare")
    at.query_params["jobs"] = f"{a},{b}"
    at.run()
    at.toggle(key="compare_diff").set_value(True).run()
    table = at.dataframe[0].value
    assert "prompt" in table.columns and "seed" not in table.columns
    assert list(table["prompt"]) == [GENERATE["prompt"], "a whale at dusk"]


def test_history_and_compare_show_a_generate_jobs_inputs_from_its_own_folder(db_with_jobs, job_adder, load_samples,
                                                                           data_dir, tmp_path):
    from PIL import Image

    from storage.artifacts import job_dir, record_artifact

    db, ids = db_with_jobs
    elsewhere = tmp_path / "upload.png"  # where the user's file was: gone, the job's copy is what shows
    job_id = job_adder(db, status="succeeded", kind="generate", samples=load_samples,
                       generate={"prompt": "a fox", "image": str(elsewhere), "vae_dtype": "fp32", "quantize": "int8"})
    folder = job_dir(data_dir, job_id)
    folder.mkdir(parents=True)
    Image.new("RGB", (640, 360), (200, 30, 30)).save(folder / "image.png")
    record_artifact(db, data_dir, job_id, folder / "image.png")
    at = page("history").run()
    assert not at.exception, at.exception
    table = next(d.value for d in at.dataframe if "first frame" in d.value.columns)
    row = table[table["id"] == job_id].iloc[0]
    assert row["first frame"].startswith("data:image/png;base64,")
    assert (row["workflow"], row["VAE precision"], row["transformer weights"]) == ("fl2va", "fp32", "int8 (weight-only)")
    thumb = Image.open(__import__("io").BytesIO(__import__("base64").b64decode(row["first frame"].split(",", 1)[1])))
    assert max(thumb.size) <= 96  # a thumbnail, not the frame

    compare = page("compare")
    compare.query_params["jobs"] = f"{ids['stream']},{job_id}"
    compare.run()
    assert not compare.exception, compare.exception
    assert [c for image in compare.get("image") for c in image.captions] == ["First frame (image.png)"]


def test_history_pages_through_every_job_and_counts_them_all(fresh_db):
    """#41-15: with more jobs than a page holds, every one is reachable and the counts are over all of them."""
    for i in range(230):
        job_id = jobs_table.enqueue(fresh_db, "load", {"model": "/models/tiny", "mode": "stream"}, now=float(i))
        if i % 10:
            jobs_table.start(fresh_db, job_id, supervisor_id="test", now=float(i))
            jobs_table.finish(fresh_db, job_id, "succeeded", now=float(i) + 1)
    at = page("history").run()
    assert not at.exception, at.exception
    assert "23 queued · 207 succeeded" in _text(at)
    assert len(at.dataframe[0].value) == 100 and at.dataframe[0].value["id"].iloc[0] == 230
    assert "Jobs 1–100 of 230 matching (230 in all)" in _text(at)
    at.number_input(key="history_page").set_value(3).run()
    assert sorted(at.dataframe[0].value["id"]) == list(range(1, 31))  # the oldest, out of reach before
    assert "Jobs 201–230 of 230 matching (230 in all)" in _text(at)
    at.segmented_control(key="status").set_value("Queued").run()
    assert "23 matching (230 in all)" in _text(at) and len(at.dataframe[0].value) == 23


def test_history_shows_a_generate_jobs_memory_and_time_and_never_none(db_with_jobs, job_adder, load_samples):
    db, ids = db_with_jobs
    fox = job_adder(db, status="succeeded", kind="generate", model="/models/demo", samples=load_samples,
                    generate=GENERATE, metrics={"peak_footprint": 3 * 2**29})
    job_adder(db, status="queued")
    small = job_adder(db, status="succeeded", kind="generate", model="/models/demo", generate=GENERATE,
                      metrics={"peak_footprint": 700 * 2**20})
    at = page("history").run()
    assert not at.exception, at.exception
    frame = at.dataframe[0].value.set_index("id")
    assert frame.loc[fox, "peak footprint"] == pytest.approx(1.5)
    assert frame.loc[small, "peak footprint"] == pytest.approx(700 / 1024)
    assert b"700.0 MiB" in at.dataframe[0].proto.arrow_data.styler.display_values  # MiB under 1 GiB
    assert frame.loc[fox, "duration"] == pytest.approx(20, abs=1)
    assert frame.loc[ids["stream"], "peak footprint"] > 0  # a load's from its samples, by the same definition
    shown = at.dataframe[0].proto.arrow_data.styler.display_values
    assert b"None" not in shown and b"nan" not in shown
    assert not frame.drop(columns=["in use"]).isna().any().any()  # Streamlit draws an empty cell as "None"


def test_the_run_pages_queue_moves_a_job_to_the_front_and_clears_after_confirming(fresh_db, job_adder):
    running = job_adder(fresh_db, status="running")
    queued = [job_adder(fresh_db, status="queued") for _ in range(3)]
    at = page("run").run()
    assert not at.exception, at.exception
    lines = [m.value for m in at.markdown if "· queued" in m.value]
    assert f"2nd in the queue, behind job {running} (running) and job {queued[0]}" in lines[1]
    at.button(key=f"front_{queued[2]}").click().run()
    assert jobs_table.claim_oldest(fresh_db, "test") == queued[2]
    st.cache_data.clear()  # the job list is cached for a second
    at.run()
    at.button(key="run_clear_queue_button").click().run()
    assert any(w.value.startswith(f"Cancel the 2 queued jobs ({queued[0]}, {queued[1]})?") for w in at.warning)
    at.button(key="run_clear_queue_confirm").click().run()
    statuses = dict(fresh_db.execute("SELECT id, status FROM jobs").fetchall())
    assert [statuses[i] for i in queued] == ["cancelled", "cancelled", "running"]
    assert statuses[running] == "running"


def test_a_queued_jobs_page_says_its_place_not_a_stage_or_an_empty_chart(fresh_db, job_adder):
    running = job_adder(fresh_db, status="running")
    first = job_adder(fresh_db, status="queued")
    second = job_adder(fresh_db, status="queued")
    at = page("job")
    at.query_params["job"] = str(second)
    at.run()
    assert not at.exception, at.exception
    assert [s.value for s in at.subheader if s.value in ("Queued", "Starting")] == ["Queued"]
    assert any(i.value == f"2nd in the queue, behind job {running} (running) and job {first}." for i in at.info)
    assert not any("Starting the job" in i.value for i in at.info)
    assert "No memory samples yet" in _text(at) and not at.get("arrow_vega_lite_chart")
