"""The Models page lists every checkpoint under the roots and the Hugging Face cache, with its layout, sizes,
dtypes and fit, and opens Run with the one picked."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

import models.request.params  # noqa: F401  (AppTest puts the page's folder, which holds a models.py, first on sys.path)
from dashboard import nav
from tests.hub_layout import hub_snapshot

ROOT = Path(__file__).resolve().parents[2]


def test_every_checkpoint_is_listed_with_its_layout_and_fit_and_opens_run(fresh_db, tiny_checkpoint, data_dir,
                                                                          tmp_path, monkeypatch):
    (tmp_path / "download").mkdir()
    (tmp_path / "download" / "dit.safetensors").write_bytes(tiny_checkpoint.read_bytes())
    snapshot = hub_snapshot(tmp_path / "download", tmp_path / "hub", repo_id="org/tiny-dit")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    broken = data_dir / "models" / "broken.safetensors"
    broken.write_bytes(tiny_checkpoint.read_bytes()[:-100])
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "models.py"), default_timeout=60).run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    rows = {r["model"]: r for r in table.to_dict("records")}
    assert set(rows) == {"broken.safetensors", "tiny.safetensors", "org/tiny-dit @ main"}
    assert (rows["tiny.safetensors"]["layout"], rows["tiny.safetensors"]["fit (weights)"]) == ("single file", "fits")
    assert rows["tiny.safetensors"]["components"].startswith("tiny ") and "(F32)" in rows["tiny.safetensors"]["components"]
    assert rows["org/tiny-dit @ main"]["layout"] == "component folder"
    assert rows["broken.safetensors"]["fit (weights)"].startswith("broken: ")
    buttons = [b for b in at.button if b.label == "Open in Run"]
    assert [b.disabled for b in buttons] == [True, False, False]  # broken first (name order under the root)
    buttons[2].click().run()
    assert at.session_state[nav.NAVIGATED_KEY] == ("run", {"checkpoint": str(snapshot)})


def test_the_run_page_opens_on_the_checkpoint_the_models_page_links(fresh_db, tiny_checkpoint, tmp_path, monkeypatch):
    (tmp_path / "download").mkdir()
    (tmp_path / "download" / "dit.safetensors").write_bytes(tiny_checkpoint.read_bytes())
    snapshot = hub_snapshot(tmp_path / "download", tmp_path / "hub", repo_id="org/tiny-dit")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "run.py"), default_timeout=60)
    at.query_params["checkpoint"] = str(snapshot)
    at.run()
    assert not at.exception, at.exception
    assert at.selectbox(key="run_checkpoint").value == str(snapshot)


def test_a_gguf_file_is_listed_with_its_quant_types_and_opens_run_as_a_generate_s_transformer(fresh_db, data_dir):
    from dashboard import form_state
    from tests.loader.gguf_files import gguf_bytes

    dit = data_dir / "models" / "dit-Q8_0.gguf"
    dit.write_bytes(gguf_bytes([("blocks.0.attn.qkv_proj.weight", (96, 32), "Q8_0"),
                                ("blocks.0.norm.weight", (32,), "F32")]))
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "models.py"), default_timeout=60).run()
    assert not at.exception, at.exception
    rows = {r["model"]: r for r in at.dataframe[0].value.to_dict("records")}
    assert rows["dit-Q8_0.gguf"]["layout"] == "GGUF file"
    assert rows["dit-Q8_0.gguf"]["components"].endswith("(Q8_0, F32)")
    buttons = [b for b in at.button if b.label == "Open in Run"]
    buttons[list(rows).index("dit-Q8_0.gguf")].click().run()
    assert at.session_state[nav.NAVIGATED_KEY] == ("run", {"kind": "generate"})
    assert at.session_state[form_state.FORM_KEY]["gen_transformer"] == str(dit)


def test_the_folder_stamp_changes_when_a_checkpoint_is_added_two_levels_down_and_not_otherwise(tmp_path):
    from dashboard.data import folder_stamp

    import os

    (tmp_path / "a").mkdir()
    for folder in (tmp_path, tmp_path / "a"):  # an hour ago: the kernel's coarse clock cannot hide a change
        os.utime(folder, ns=(folder.stat().st_mtime_ns - 3600 * 10**9,) * 2)
    roots = (str(tmp_path), str(tmp_path / "missing"))
    before = folder_stamp(roots)
    assert folder_stamp(roots) == before
    (tmp_path / "a" / "dit.gguf").write_bytes(b"x")
    after_nested = folder_stamp(roots)
    assert after_nested != before
    (tmp_path / "top.gguf").write_bytes(b"x")
    assert folder_stamp(roots) != after_nested
