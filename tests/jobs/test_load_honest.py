"""A load job is an honest check (issue 27): it fails where generate's load would, and `jobs submit`
refuses what the Run page refuses, through the same loader check."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from dashboard.views.checkpoints import describe_checkpoint
from jobs.cli import main
from jobs.errors import JobSpecError
from jobs.spec import build_spec

pytestmark = pytest.mark.usefixtures("launched_workers")  # submits here start no real worker

SHARD = "diffusion_pytorch_model-00001-of-00001.safetensors"
INDEX = "diffusion_pytorch_model.safetensors.index.json"


def _copy_transformer(tiny_model, name: str, tensors=None):
    """A component folder holding the tiny H3 transformer's config and `tensors` (default: its own)."""
    folder = tiny_model.parent / name
    folder.mkdir()
    shutil.copy(tiny_model / "transformer" / "config.json", folder / "config.json")
    tensors = tensors if tensors is not None else load_file(str(tiny_model / "transformer" / SHARD))
    save_file(tensors, str(folder / SHARD))
    (folder / INDEX).write_text(json.dumps({"weight_map": dict.fromkeys(tensors, SHARD)}))
    return folder


def _renamed(tiny_model):
    tensors = load_file(str(tiny_model / "transformer" / SHARD))
    first = sorted(tensors)[0]
    tensors["renamed." + first] = tensors.pop(first)
    return _copy_transformer(tiny_model, "renamed", tensors), first


def test_a_renamed_tensor_fails_the_load_job_and_loads_with_skeleton(tiny_model, queue_job, run_to_end):
    folder, first = _renamed(tiny_model)
    job = run_to_end(queue_job("load", model=str(folder)), timeout=120)
    assert job["status"] == "failed"
    assert "1 missing" in job["error"] and "1 unexpected" in job["error"] and first in job["error"]
    generic = run_to_end(queue_job("load", model=str(folder), skeleton=True), timeout=120)
    assert generic["status"] == "succeeded", generic["error"]


def test_a_sound_copy_of_a_known_class_still_loads(tiny_model, queue_job, run_to_end):
    job = run_to_end(queue_job("load", model=str(_copy_transformer(tiny_model, "sound"))), timeout=120)
    assert job["status"] == "succeeded", job["error"]


def test_another_layout_for_a_known_class_is_one_bounded_message_with_the_way_out(tiny_model, queue_job, run_to_end):
    import torch

    other = {f"blocks.{i}.weight": torch.ones(4) for i in range(48)}
    job = run_to_end(queue_job("load", model=str(_copy_transformer(tiny_model, "other", other))), timeout=120)
    assert job["status"] == "failed" and len(job["error"]) < 1500
    assert "48 unexpected, e.g. blocks.0.weight, blocks.1.weight, blocks.10.weight, ..." in job["error"]
    assert "these tensors do not match diffusers' MiniMaxH3Transformer3DModel; to load them as a generic" \
        " checkpoint, use --skeleton" in job["error"]


def test_a_truncated_checkpoint_is_refused_by_jobs_submit_as_by_the_run_page(tiny_model, config, capsys, db):
    folder = _copy_transformer(tiny_model, "cut")
    shard = folder / SHARD
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    page = describe_checkpoint(folder, config.model_roots[0], config.model_roots)
    assert not page.ok
    assert main(["submit", "load", "--model", str(folder), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    # The same check refuses it in both; the page folds the per-tensor lines into one sentence.
    assert out["errors"][0].startswith("model: ") and SHARD in out["errors"][0] and "truncated" in out["errors"][0]
    assert SHARD in page.problems[0] and "is truncated" in page.problems[0]


def test_skeleton_is_a_load_only_boolean(config, tiny_model):
    model = str(tiny_model / "transformer")
    assert build_spec({"kind": "load", "model": model, "skeleton": True}, config).options.skeleton is True
    with pytest.raises(JobSpecError, match="skeleton: must be true or false"):
        build_spec({"kind": "load", "model": model, "skeleton": "yes"}, config)
    with pytest.raises(JobSpecError, match="skeleton: only load jobs"):
        build_spec({"kind": "generate", "model": str(tiny_model), "skeleton": True,
                    "generate": {"prompt": "a fox"}}, config)


def test_a_fifo_named_like_a_shard_is_refused_by_jobs_submit_without_hanging(tiny_model, config, capsys, db):
    import os
    import threading

    folder = _copy_transformer(tiny_model, "fifo")
    (folder / SHARD).unlink()
    os.mkfifo(folder / SHARD)
    codes: list[int] = []
    worker = threading.Thread(target=lambda: codes.append(main(["submit", "load", "--model", str(folder), "--json"])),
                              daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "jobs submit blocked opening a FIFO"
    assert codes == [2] and "is a FIFO, not a regular file" in json.loads(capsys.readouterr().out)["error"]


def test_a_fifo_among_the_tokenizer_files_is_refused_by_jobs_submit_generate_without_hanging(tiny_model, config,
                                                                                            capsys, db):
    """transformers and tokenizers open a tokenizer's files by path themselves, so the loader's confined open
    does not cover them; the folder is checked for special files before they run."""
    import os
    import threading

    root = tiny_model.parent / "fifo-tokenizer"
    shutil.copytree(tiny_model, root)
    (root / "tokenizer" / "tokenizer.json").unlink()
    os.mkfifo(root / "tokenizer" / "tokenizer.json")
    codes: list[int] = []
    argv = ["submit", "generate", "--model", str(root), "--prompt", "a fox " * 400, "--json"]
    worker = threading.Thread(target=lambda: codes.append(main(argv)), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "jobs submit generate blocked opening a FIFO tokenizer file"
    assert codes == [2] and "is a FIFO, not a regular file" in json.loads(capsys.readouterr().out)["error"]
