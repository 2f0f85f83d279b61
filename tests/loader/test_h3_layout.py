"""Discovery and loading of the real MiniMax H3 layout: modular_model_index.json, diffusers and
transformers folders, non-weight folders, transformer_ref, mixed-dtype shards, excluded tensors."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import loader.model_registry as model_registry
import loader.placement.dict_modes as dict_modes
from loader import LoadOptions, discover_checkpoint, load_checkpoint
from loader.cli import main

from .h3_layout import NON_WEIGHT, TEXT_ENCODER_SHARDS, TINY_DIT, WEIGHT_COMPONENTS, write_h3_layout


@pytest.fixture(autouse=True)
def no_model_builders(monkeypatch):
    """The layout's components hold a few tensors of made-up shapes, loaded as skeletons from their own metadata:
    a builder an earlier test registered (transformers' Qwen3-VL at its default size) must not apply here."""
    monkeypatch.setattr(model_registry, "_BUILDERS", {})


def _saved_tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(shard)))
    return out


def test_inspect_json_lists_every_weight_component_with_its_class_and_the_non_weight_folders(h3_root, capsys):
    assert main(["inspect", str(h3_root), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["layout"] == "model" and summary["index_file"] == "modular_model_index.json"
    assert summary["pipeline_class"] == "MiniMaxH3ModularPipeline"
    classes = {c["name"]: (c["library"], c["class_name"]) for c in summary["components"]}
    assert classes == WEIGHT_COMPONENTS
    assert {a["name"]: (a["library"], a["class_name"]) for a in summary["non_weight"]} == {
        k: v[:2] for k, v in NON_WEIGHT.items()
    }
    assert next(a for a in summary["non_weight"] if a["name"] == "tokenizer")["files"] == ["tokenizer.json", "tokenizer_config.json"]
    transformer = next(c for c in summary["components"] if c["name"] == "transformer")
    assert transformer["shards"] == len(list((h3_root / "transformer").glob("diffusion_pytorch_model-*.safetensors"))) > 1
    assert set(transformer["dtypes"]) == {"BF16", "F32"}  # mixed-dtype shards: fp32 keep modules next to bf16
    text_encoder = next(c for c in summary["components"] if c["name"] == "text_encoder")
    assert text_encoder["shards"] == 2 and text_encoder["tensors"] == sum(len(n) for _, n in TEXT_ENCODER_SHARDS)


def test_inspect_text_lists_non_weight_folders_as_such(h3_root, capsys):
    assert main(["inspect", str(h3_root)]) == 0
    out = capsys.readouterr().out
    assert "MiniMaxH3ModularPipeline" in out
    assert "class=MiniMaxH3Transformer3DModel" in out and "class=Qwen3VLForConditionalGeneration" in out
    assert "  scheduler: no weights (1 file(s)) class=MiniMaxH3Scheduler" in out


def test_a_classic_model_index_json_is_read_the_same_way(tmp_path):
    root = write_h3_layout(tmp_path / "h3", index_name="model_index.json")
    index = discover_checkpoint(root)
    assert {n: (c.library, c.class_name) for n, c in index.components.items()} == WEIGHT_COMPONENTS
    assert set(index.aux) == set(NON_WEIGHT) and index.pipeline_class == "MiniMaxH3Pipeline"


def test_a_modular_entry_may_name_another_subfolder_and_absent_entries_are_listed(h3_root, tmp_path):
    root = tmp_path / "h3"
    shutil.copytree(h3_root, root)
    (root / "transformer").rename(root / "dit")
    index_path = root / "modular_model_index.json"
    index = json.loads(index_path.read_text())
    index["transformer"][2]["subfolder"] = "dit"
    index["image_encoder"] = ["transformers", "Missing", {"subfolder": "image_encoder", "type_hint": ["transformers", "Missing"]}]
    index["default_fps"] = 24  # a config value, not a component
    index_path.write_text(json.dumps(index))
    found = discover_checkpoint(root)
    assert found.components["transformer"].path == root / "dit"
    assert found.absent == ["image_encoder"] and "default_fps" not in found.components


def test_a_component_folder_alone_takes_its_class_from_config_json(h3_root):
    assert discover_checkpoint(h3_root / "transformer").component().class_name == "MiniMaxH3Transformer3DModel"
    assert discover_checkpoint(h3_root / "text_encoder").component().class_name == "Qwen3VLForConditionalGeneration"


@pytest.mark.parametrize("mode", ["stream", "drain", "retain"])
def test_a_generic_skeleton_load_keeps_each_tensor_bit_for_bit_and_its_dtype(h3_root, mode):
    module, report = load_checkpoint(h3_root, LoadOptions(component="transformer", mode=mode))
    saved = _saved_tensors(h3_root / "transformer")
    state = module.state_dict()
    assert set(state) == set(saved) and report.tensors_placed == len(saved)
    for name, tensor in saved.items():
        assert state[name].dtype == tensor.dtype and torch.equal(state[name], tensor), name
    assert state["proj_in.weight"].dtype == torch.float32 and state["transformer_blocks.0.attn.to_q.weight"].dtype == torch.bfloat16


def test_diffusers_class_built_on_meta_is_filled_strictly_from_the_real_layout(h3_root):
    from diffusers import MiniMaxH3Transformer3DModel

    with torch.device("meta"):
        empty = MiniMaxH3Transformer3DModel(**TINY_DIT)
    module, report = load_checkpoint(h3_root, LoadOptions(component="transformer_ref", strict=True), module=empty)
    saved = _saved_tensors(h3_root / "transformer_ref")
    assert report.missing == [] and report.unexpected == []
    state = module.state_dict()
    assert all(torch.equal(state[n], t) for n, t in saved.items())


def _unused_by_t2va(name: str) -> bool:
    return name.startswith("lm_head.") or name.startswith("model.visual.") or ".layers.2." in name


@pytest.mark.parametrize("mode", ["stream", "drain", "retain"])
def test_excluded_tensors_are_never_read_not_unexpected_and_reported_with_bytes(h3_root, mode, monkeypatch):
    opened: list[str] = []
    reads: list[tuple[str, int, int]] = []
    real_reopen, real_preadv = dict_modes.reopen, os.preadv

    def spying_reopen(file, *args, **kwargs):
        opened.append(Path(file).name)
        return real_reopen(file, *args, **kwargs)

    def spying_preadv(fd, buffers, offset, *args):
        reads.append((Path(os.readlink(f"/proc/self/fd/{fd}")).name, offset, sum(len(memoryview(b).cast("B")) for b in buffers)))
        return real_preadv(fd, buffers, offset, *args)

    monkeypatch.setattr(dict_modes, "reopen", spying_reopen)
    monkeypatch.setattr(os, "preadv", spying_preadv)
    module, report = load_checkpoint(h3_root, LoadOptions(component="text_encoder", mode=mode, exclude=_unused_by_t2va))

    meta = {t.name: t for t in discover_checkpoint(h3_root / "text_encoder").component().tensors}
    excluded = sorted(n for n in meta if _unused_by_t2va(n))
    assert sorted(report.excluded) == excluded and len(excluded) == 3
    assert report.excluded_bytes == sum(meta[n].nbytes for n in excluded)
    assert report.unexpected == [] and not set(excluded) & set(module.state_dict())
    assert report.bytes_read == sum(t.nbytes for n, t in meta.items() if n not in excluded)
    as_dict = report.to_dict()
    assert as_dict["excluded_tensors"] == 3 and as_dict["excluded_bytes"] == report.excluded_bytes
    assert sorted(as_dict["excluded"]) == excluded
    only_excluded_shard = TEXT_ENCODER_SHARDS[1][0]
    assert only_excluded_shard not in opened
    for n in excluded:  # no positioned read touches an excluded tensor's bytes
        t = meta[n]
        assert not any(f == t.file.name and off < t.offset + t.nbytes and t.offset < off + size for f, off, size in reads), n
    if mode == "stream":
        assert reads, "the spy saw the stream mode's reads"
