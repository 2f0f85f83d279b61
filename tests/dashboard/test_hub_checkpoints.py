"""The Run page offers what the Hugging Face cache holds, named `org/name @ revision`, with nothing configured."""

from __future__ import annotations

from tests.dashboard.test_run_page import _labels, _queued, run_page
from tests.hub_layout import hub_snapshot


def test_a_hub_snapshot_is_offered_by_repository_and_ref_and_queues(fresh_db, tiny_checkpoint, tmp_path, monkeypatch):
    (tmp_path / "download").mkdir()
    (tmp_path / "download" / "dit.safetensors").write_bytes(tiny_checkpoint.read_bytes())
    snapshot = hub_snapshot(tmp_path / "download", tmp_path / "hub", repo_id="org/tiny-dit")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    at = run_page().run()
    assert not at.exception, at.exception
    assert [label.split(" — ")[0] for label in _labels(at)] == ["tiny.safetensors", "org/tiny-dit @ main"]
    at.selectbox(key="run_checkpoint").set_value(str(snapshot)).run()
    at.button(key="run_submit").click().run()
    assert [spec["model"] for spec in _queued(fresh_db)] == [str(snapshot)]

def test_a_path_outside_the_roots_names_the_root_that_would_hold_it(data_dir, tmp_path):
    from dashboard.views.checkpoints import outside_roots

    (tmp_path / "elsewhere" / "h3").mkdir(parents=True)
    message = outside_roots(str(tmp_path / "elsewhere" / "h3"), [data_dir / "models"])
    assert f"A root holding it: {tmp_path / 'elsewhere'}; add it to DRAINBOARD_MODEL_ROOTS" in message
