"""A load job reads only files under the configured model roots (links resolved)."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from jobs.errors import JobSpecError
from storage.config import load_config
from tests.jobs.test_kind_load import write_component


@pytest.fixture
def config(config, tmp_path, monkeypatch):
    """Two model roots: the data folder's `models` and `more`."""
    (tmp_path / "more").mkdir()
    monkeypatch.setenv("DRAINBOARD_MODEL_ROOTS", os.pathsep.join([str(config.model_roots[0]), str(tmp_path / "more")]))
    return load_config()


def test_a_load_whose_index_escapes_the_roots_is_refused_at_submit_naming_the_entry(queue_job, config, tmp_path):
    root = config.model_roots[0] / "escape"
    write_component(root, {"w": torch.ones(4)})
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    save_file({"w": torch.ones(4)}, str(outside / "outside.safetensors"))
    component = root / "transformer"
    rel = os.path.relpath(outside / "outside.safetensors", component)
    (component / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": rel}}))
    with pytest.raises(JobSpecError) as refused:
        queue_job("load", model=str(root), component="transformer")
    assert "resolves outside the model roots" in str(refused.value) and rel in str(refused.value)


def test_a_component_linked_into_another_configured_root_loads(queue_job, run_to_end, config):
    first, second = config.model_roots
    write_component(second / "shared", {"w": torch.ones(4)})
    (first / "linked").mkdir()
    (first / "linked" / "model_index.json").write_text(json.dumps({"transformer": ["x", "Unknown"]}))
    (first / "linked" / "transformer").symlink_to(second / "shared" / "transformer")
    job = run_to_end(queue_job("load", model=str(first / "linked"), component="transformer"))
    assert job["status"] == "succeeded", job["error"]
    assert job["metrics"]["tensors_placed"] == 1
