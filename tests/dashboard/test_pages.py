"""Each page runs standalone under AppTest (st.navigation is app.py's job)."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

PAGES = ["run", "job", "history", "compare", "system"]
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
        fresh_db, status="killed", mode="retain", samples=load_samples.iloc[:40], signal="SIGKILL", model=model
    )
    return fresh_db, ids


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
    assert any("Footprint ratio" in str(df.value) or "footprint_ratio" in df.value.to_string() for df in at.dataframe)
    assert "Job " + str(ids["drain"]) in _text(at)


def test_killed_job_says_where_it_died_and_offers_retry(db_with_jobs):
    db, ids = db_with_jobs
    at = page("job")
    at.query_params["job"] = str(ids["killed"])
    at.run()
    assert not at.exception, at.exception
    assert any("Killed (SIGKILL) at" in e.value for e in at.error)
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
    assert any("memory_limit" in m or "not a size" in m or "not available" in m for m in messages), messages


def test_run_page_previews_the_offload_policy_for_the_chosen_device(fresh_db, tiny_checkpoint):
    at = page("run").run()
    preview = next(df.value for df in at.dataframe if "flag" in df.value.columns)
    row = preview.set_index("flag").loc["dit_cpu_offload"]
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


def test_job_page_of_a_load_opens_above_baseline_with_the_model_diagonal(db_with_jobs):
    _, ids = db_with_jobs
    at = page("job")
    at.query_params["job"] = str(ids["drain"])
    at.run()
    assert not at.exception, at.exception
    assert at.segmented_control(key="job_fit").value == "Above baseline"
    diagonal = "'mark': {'type': 'line', 'color': '#888'"
    assert "above the job's first sample" in str(_chart_specs(at)) and diagonal in str(_chart_specs(at))
    at.segmented_control(key="job_fit").set_value("Fit data").run()
    assert "above the job's first sample" not in str(_chart_specs(at)) and diagonal not in str(_chart_specs(at))


def test_job_page_of_a_generate_job_shows_steps_and_peak_footprint_not_placement(db_with_jobs, job_adder, load_samples):
    db, _ = db_with_jobs
    metrics = {"peak_footprint": 3 * 2**29, "stage_peaks": {"conditioning": 3 * 2**29, "denoising": 2**30},
               "stage_seconds": {"denoising": 6.0}}
    job_id = job_adder(db, status="succeeded", kind="generate", samples=load_samples, metrics=metrics)
    db.execute("UPDATE jobs SET progress_done = 6, progress_total = 6 WHERE id = ?", [job_id])
    at = page("job")
    at.query_params["job"] = str(job_id)
    at.run()
    assert not at.exception, at.exception
    cards = {m.label: m for m in at.metric}
    assert "Placed" not in cards and "Footprint ratio" not in cards
    assert cards["Denoising steps"].value == "6/6"
    assert cards["Peak footprint"].value == "1.50 GiB"
    assert set(cards) == {"Denoising steps", "Peak system in use", "Peak footprint", "Min headroom", "Peak VmRSS"}
