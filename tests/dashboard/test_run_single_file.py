"""The Run page's single-file transformer field: a Comfy-style DiT under a model root queues beside the model;
one outside the roots, or of another model, is refused under the field and nothing is queued."""

from __future__ import annotations

import torch

from tests.dashboard.test_run_generate import _queued, generate_page, tiny_root, tiny_source  # noqa: F401 (fixtures)
from tests.models.reference_layout import reference_tensors, write_single_file


def test_a_single_file_dit_queues_beside_the_model_and_a_bad_one_is_refused_under_the_field(
        tiny_root, fresh_db, data_dir, tmp_path):
    good = write_single_file(reference_tensors(tiny_root / "transformer"), data_dir / "models" / "dit.safetensors",
                             data_start_mod8=5)
    outside = write_single_file(reference_tensors(tiny_root / "transformer"), tmp_path / "away.safetensors")
    other = write_single_file({"encoder.weight": torch.ones(2, 2)}, data_dir / "models" / "bert.safetensors")
    at = generate_page()
    at.selectbox(key="run_checkpoint").set_value(str(tiny_root)).run()  # the single files are listed too
    assert not at.exception, at.exception
    assert at.selectbox(key="run_gen_qkv_layout").value == "stacked"
    for path, said in ((outside, "is outside the model roots"), (other, "not a MiniMax H3 DiT in the original layout")):
        at.text_input(key="run_gen_transformer").set_value(str(path)).run()
        if not at.button(key="run_submit").disabled:  # the page checks the spec as it changes
            at.button(key="run_submit").click().run()
        assert any(said in e.value for e in at.error), [e.value for e in at.error]
        assert _queued(fresh_db) == []
    at.text_input(key="run_gen_transformer").set_value(str(good)).run()
    at.button(key="run_submit").click().run()
    [spec] = _queued(fresh_db)
    assert (spec["model"], spec["generate"]["transformer"], spec["generate"]["qkv_layout"]) == \
        (str(tiny_root), str(good), "stacked")
