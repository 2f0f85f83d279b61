"""What a generate cannot run is refused at submit in one line naming what was found, and nothing is queued:
GGUF, pickles, packed weights (NVFP4, int8 ConvRot), a remote-code or pruned DiT, a single file of any model."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from jobs.queue import submit
from jobs.spec import JobSpecError
from tests.models.reference_layout import reference_tensors, write_single_file


def _refusal(db, config, model, **generate) -> str:
    with pytest.raises(JobSpecError) as refused:
        submit(db, {"kind": "generate", "model": str(model), "generate": {"prompt": "a fox", **generate}}, config)
    assert db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 0
    return str(refused.value)


def test_a_corrupt_gguf_a_misnamed_one_or_a_pickle_given_as_the_dit_is_refused_naming_the_format(db, config,
                                                                                                 tiny_model):
    gguf = config.model_roots[0] / "h3-Q4_K.gguf"
    gguf.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 40) + b"blocks.0")
    assert _refusal(db, config, tiny_model, transformer=str(gguf)) == (
        "generate.transformer: h3-Q4_K.gguf: truncated GGUF header: the file ends at byte 40 inside tensor info 0")
    misnamed = config.model_roots[0] / "h3-Q8_0.safetensors"
    misnamed.write_bytes(b"GGUF" + struct.pack("<I", 3) + bytes(64))
    assert _refusal(db, config, tiny_model, transformer=str(misnamed)) == (
        "generate.transformer: h3-Q8_0.safetensors: a GGUF file (version 3) named as safetensors; a GGUF DiT is "
        "read by diffusers' GGUF path, which its .gguf suffix selects: rename it h3-Q8_0.gguf")
    pickle = config.model_roots[0] / "h3.ckpt"
    pickle.write_bytes(b"PK\x03\x04" + bytes(64))
    assert "h3.ckpt: a PyTorch pickle (torch.save's format), which is never unpickled" in \
        _refusal(db, config, tiny_model, transformer=str(pickle))


def test_packed_weights_in_a_single_file_are_refused_naming_the_tensor(db, config, tiny_model):
    tensors = reference_tensors(tiny_model / "transformer")
    tensors["blocks.0.attn.qkv_proj.weight"] = torch.zeros(96, 16, dtype=torch.uint8)  # two fp4 values a byte
    tensors["blocks.0.attn.qkv_proj.weight_scale"] = torch.ones(96, 2)
    file = write_single_file(tensors, config.model_roots[0] / "nvfp4.safetensors")
    assert _refusal(db, config, tiny_model, transformer=str(file)) == (
        "generate.transformer: nvfp4.safetensors: packed or quantized weights: blocks.0.attn.qkv_proj.weight is U8 "
        "(96, 16) beside blocks.0.attn.qkv_proj.weight_scale (NVFP4, int8 ConvRot or another packed format), which "
        "diffusers' MiniMaxH3Transformer3DModel cannot take; use the bf16 checkpoint")


def test_a_remote_code_or_pruned_dit_folder_is_refused_naming_what_its_config_says(db, config, tiny_model):
    path = tiny_model / "transformer" / "config.json"
    original = json.loads(path.read_text())
    path.write_text(json.dumps({**original, "auto_map": {"AutoModel": "modeling_h3.PrunedH3"}}))
    assert "a layout with remote code (auto_map {'AutoModel': 'modeling_h3.PrunedH3'}); Drainboard runs no code" in \
        _refusal(db, config, tiny_model)
    pruned = {k: v for k, v in original.items() if k != "_class_name"} | {"adaln_rank": 16}
    path.write_text(json.dumps(pruned))
    assert "a DiT that diffusers has no class for (_class_name None and adaln_rank; a pruned layout?)" in \
        _refusal(db, config, tiny_model)


def test_a_single_file_given_as_the_model_is_refused_saying_where_it_goes(db, config, tiny_model):
    reference = write_single_file(reference_tensors(tiny_model / "transformer"), config.model_roots[0] / "dit.safetensors")
    assert _refusal(db, config, reference) == (
        "model: dit.safetensors: a single file holding a MiniMax H3 DiT in the original layout (46 tensors), not a MiniMax H3 "
        "model folder (modular_model_index.json and its components); a single-file DiT goes in --transformer (the "
        "Run page's Single-file transformer) with the model folder that supplies the rest")
    assert "dummy.safetensors: a single file of an unknown model (1 tensors)" in \
        _refusal(db, config, config.model_roots[0] / "dummy.safetensors")
