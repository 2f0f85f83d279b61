"""A Hugging Face cache snapshot loads with no root configured: its links into its own repository's blobs
are inside, a link out of the repository is refused, and the model is named `org/name @ revision`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from core import CheckpointError
from core.hub_cache import HubSnapshot, holding_root, hub_cache_folder, model_label, snapshot_of
from loader import discover_checkpoint, load_checkpoint
from loader.cli import main
from tests.hub_layout import REVISION, hub_snapshot


@pytest.fixture
def snapshot(tiny_checkpoint, tmp_path: Path) -> Path:
    """The tiny component folder downloaded as `org/tiny` into tmp_path/hub."""
    return hub_snapshot(tiny_checkpoint.path, tmp_path / "hub", repo_id="org/tiny")


def test_a_snapshot_is_its_own_root_and_loads_through_its_blob_links(snapshot: Path, tiny_checkpoint):
    assert all(p.is_symlink() for p in snapshot.iterdir())
    module, report = load_checkpoint(snapshot)  # no roots: the snapshot folder itself
    assert report.tensors_placed == len(tiny_checkpoint.tensors)
    loaded = module.state_dict()
    for name, tensor in tiny_checkpoint.tensors.items():
        assert torch.equal(loaded[name], tensor), name


def test_inspect_names_the_snapshot_by_repository_and_ref(snapshot: Path, capsys):
    assert main(["inspect", str(snapshot), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "org/tiny @ main"
    assert main(["inspect", str(snapshot)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("org/tiny @ main: ") and "(component)" in first


def test_a_revision_no_ref_names_is_shown_by_its_hash(tiny_checkpoint, tmp_path: Path):
    snapshot = hub_snapshot(tiny_checkpoint.path, tmp_path / "hub", repo_id="org/tiny", ref=None)
    assert model_label(snapshot) == f"org/tiny @ {REVISION[:12]}"
    assert model_label(snapshot / "x.safetensors") == f"org/tiny @ {REVISION[:12]} (x.safetensors)"
    assert model_label(tmp_path) == str(tmp_path)


def test_a_snapshot_link_out_of_its_repository_is_refused_naming_the_root_that_would_hold_it(
        snapshot: Path, tmp_path: Path):
    outside = tmp_path / "elsewhere" / "secret.safetensors"
    outside.parent.mkdir()
    save_file({"w": torch.ones(2)}, str(outside))
    shard = next(p for p in sorted(snapshot.iterdir()) if p.name.endswith(".safetensors"))
    shard.unlink()
    shard.symlink_to(os.path.relpath(outside, shard.parent))
    with pytest.raises(CheckpointError) as refused:
        discover_checkpoint(snapshot)
    message = str(refused.value)
    assert "resolves outside the model roots" in message and shard.name in message
    assert f"A root holding it: {tmp_path / 'elsewhere'} (python -m loader: --root {tmp_path / 'elsewhere'}" in message


def test_a_link_into_another_repository_of_the_same_cache_is_refused(snapshot: Path, tmp_path: Path):
    other = hub_snapshot(snapshot, tmp_path / "hub", repo_id="org/other")
    shard = next(p for p in sorted(other.iterdir()) if p.name.endswith(".safetensors"))
    target = os.path.realpath(snapshot / shard.name)
    shard.unlink()
    shard.symlink_to(os.path.relpath(target, shard.parent))  # into org/tiny's blobs: outside org/other
    with pytest.raises(CheckpointError, match="resolves outside the model roots"):
        discover_checkpoint(other)


def test_a_blob_swapped_for_a_link_after_discovery_is_refused_at_load(snapshot: Path, tmp_path: Path):
    from loader.confined import reopen

    index = discover_checkpoint(snapshot)
    shard = index.component().shards[0]
    blob = Path(os.path.realpath(shard.path))
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(blob.read_bytes())
    blob.unlink()
    blob.symlink_to(outside)
    with pytest.raises(CheckpointError, match="became a link after the model-root check"):
        reopen(shard.path, shard.checked)


def test_a_file_in_the_snapshot_is_its_own_checkpoint(snapshot: Path):
    shard = next(p for p in sorted(snapshot.iterdir()) if p.name.endswith(".safetensors"))
    index = discover_checkpoint(shard)
    assert index.layout == "file" and index.component().tensor_count > 0


def test_the_cache_folder_follows_huggingface_hub_s_environment(tmp_path: Path):
    assert hub_cache_folder({"HF_HUB_CACHE": str(tmp_path / "a"), "HF_HOME": str(tmp_path / "b")}) == tmp_path / "a"
    assert hub_cache_folder({"HF_HOME": str(tmp_path / "b")}) == tmp_path / "b" / "hub"
    assert hub_cache_folder({"XDG_CACHE_HOME": str(tmp_path / "c")}) == tmp_path / "c" / "huggingface" / "hub"
    assert hub_cache_folder({}) == Path("~/.cache/huggingface/hub").expanduser()


def test_a_snapshot_is_read_from_the_path_s_own_parts(tmp_path: Path):
    repo = tmp_path / "hub" / "models--MiniMaxAI--MiniMax-H3"
    found = snapshot_of(repo / "snapshots" / "abc" / "transformer")
    assert found == HubSnapshot("MiniMaxAI/MiniMax-H3", "abc", repo)
    assert snapshot_of(tmp_path / "snapshots" / "abc") is None
    assert holding_root(repo / "blobs" / "123") == tmp_path / "hub"
    assert holding_root(tmp_path / "models" / "h3") == tmp_path / "models"
