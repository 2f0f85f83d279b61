"""Synthetic checkpoints: layout, determinism, streaming writer, and loading in every placement mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import models  # noqa: F401  (registers the builders with the loader)
from loader import known_placements, load_checkpoint
from models import get_profile, synth_checkpoint
from models.safetensors_stream import TensorSpec, write_safetensors

COMPONENTS = ("transformer", "text_encoder", "vae", "audio_vae")


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def test_tiny_synth_writes_the_diffusers_layout(tiny_model: Path):
    index = json.loads((tiny_model / "model_index.json").read_text())
    for name in COMPONENTS:
        folder = tiny_model / name
        config = json.loads((folder / "config.json").read_text())
        weight_map = json.loads(next(folder.glob("*.safetensors.index.json")).read_text())["weight_map"]
        assert index[name][1] == config["_class_name"]
        assert set(weight_map) == set(_tensors(folder))
    assert len(list((tiny_model / "transformer").glob("*.safetensors"))) > 1


def test_same_seed_writes_identical_bytes_and_another_seed_differs(tiny_model: Path, tmp_path: Path):
    synth_checkpoint(tmp_path / "same", get_profile("tiny"), shard_bytes=100_000, seed=0)
    synth_checkpoint(tmp_path / "other", get_profile("tiny"), shard_bytes=100_000, seed=1)
    for file in (tiny_model / "transformer").glob("*.safetensors"):
        assert (tmp_path / "same" / "transformer" / file.name).read_bytes() == file.read_bytes()
    a, b = _tensors(tiny_model / "transformer"), _tensors(tmp_path / "other" / "transformer")
    assert not torch.equal(a["transformer_blocks.0.attn.to_q.weight"], b["transformer_blocks.0.attn.to_q.weight"])


def test_dry_run_counts_without_writing(tmp_path: Path):
    report = synth_checkpoint(tmp_path / "never", get_profile("h3-full"), dry_run=True)
    dit = report.components[0]
    assert (dit.name, dit.tensors, dit.parameters, dit.bytes) == ("transformer", 638, 33_122_992_896, 66_245_985_792)
    assert not (tmp_path / "never").exists()


def test_streaming_writer_matches_safetensors_reading_of_chunked_values(tmp_path: Path):
    big = TensorSpec("big", (3, 5), torch.float32)
    half = TensorSpec("half", (4,), torch.bfloat16)
    values = {"big": torch.arange(15.0).reshape(3, 5), "half": torch.tensor([1.5, -2.0, 3.25, 0.5]).bfloat16()}

    def chunks(spec: TensorSpec):
        flat = values[spec.name].reshape(-1)
        yield flat[:2]
        yield flat[2:]

    write_safetensors(tmp_path / "x.safetensors", [big, half], chunks)
    got = _tensors(tmp_path)
    assert torch.equal(got["big"], values["big"]) and torch.equal(got["half"], values["half"])


def test_streaming_writer_names_a_tensor_whose_chunks_fall_short(tmp_path: Path):
    spec = TensorSpec("blocks.0.w", (4,), torch.float32)
    with pytest.raises(ValueError, match=r"'blocks.0.w'.*expected 16"):
        write_safetensors(tmp_path / "x.safetensors", [spec], lambda s: iter([torch.zeros(2)]))


@pytest.mark.parametrize("mode", known_placements())
@pytest.mark.parametrize("component", COMPONENTS)
def test_tiny_synth_loads_in_every_placement_mode(tiny_model: Path, mode: str, component: str):
    module, report = load_checkpoint(tiny_model, component=component, mode=mode)
    expected = _tensors(tiny_model / component)
    state = module.state_dict()
    assert report.tensors_placed == len(expected) and not report.missing and not report.unexpected
    assert all(torch.equal(state[k], v) for k, v in expected.items())
    assert type(module).__name__ == json.loads((tiny_model / component / "config.json").read_text())["_class_name"]
