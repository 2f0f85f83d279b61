"""A tiny checkpoint in the real MiniMax H3 on-disk layout, for discovery and load tests.

The transformer is diffusers' own `MiniMaxH3Transformer3DModel` (tiny config)
written by its `save_pretrained` in bf16 with `_keep_in_fp32_modules` in fp32,
sharded: mixed-dtype shards plus `diffusion_pytorch_model.safetensors.index.json`.
The text encoder is hand-written in transformers' layout
(`model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`,
class in `config.json` `architectures`), with `lm_head` and the vision tower
alone in the second shard. Tokenizer, processor and schedulers are folders
without weights. The root has `modular_model_index.json`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY_DIT = dict(
    num_attention_heads=2, attention_head_dim=16, hidden_size=32, num_layers=2, num_refiner_layers=1,
    ffn_dim=64, in_channels=4, audio_in_channels=4, text_dim=16, freq_dim=16, time_embed_hidden_dim=32,
    time_embed_dim=16, rope_freq_dim=4,
)
"""A MiniMaxH3Transformer3DModel small enough to build and save in a second."""

TEXT_ENCODER_SHARDS = (
    ("model-00001-of-00002.safetensors", ["model.language_model.embed_tokens.weight"]
     + [f"model.language_model.layers.{i}.mlp.down_proj.weight" for i in range(3)]),
    ("model-00002-of-00002.safetensors", ["lm_head.weight", "model.visual.blocks.0.attn.qkv.weight"]),
)
"""(file, tensor names) of the hand-written transformers-layout text encoder."""

WEIGHT_COMPONENTS = {
    "transformer": ("diffusers", "MiniMaxH3Transformer3DModel"),
    "transformer_ref": ("diffusers", "MiniMaxH3Transformer3DModel"),
    "text_encoder": ("transformers", "Qwen3VLForConditionalGeneration"),
    "vae": ("diffusers", "AutoencoderKLMiniMaxH3"),
}
NON_WEIGHT = {
    "tokenizer": ("transformers", "Qwen2TokenizerFast", {"tokenizer.json": "{}", "tokenizer_config.json": "{}"}),
    "processor": ("transformers", "Qwen3VLProcessor", {"preprocessor_config.json": "{}"}),
    "scheduler": ("diffusers", "MiniMaxH3Scheduler", {"scheduler_config.json": '{"shift": 12.0}'}),
    "audio_scheduler": ("diffusers", "MiniMaxH3Scheduler", {"scheduler_config.json": '{"shift": 3.0}'}),
}


def write_h3_layout(root: Path, *, index_name: str = "modular_model_index.json") -> Path:
    """Write the tiny real-layout checkpoint under `root` and return it."""
    from diffusers import MiniMaxH3Transformer3DModel

    root.mkdir(parents=True)
    torch.manual_seed(0)
    for name, shard_size in (("transformer", "20KB"), ("transformer_ref", "10GB")):
        model = MiniMaxH3Transformer3DModel(**TINY_DIT).to(torch.bfloat16)
        for keep in model._keep_in_fp32_modules:
            if hasattr(model, keep):
                getattr(model, keep).float()
        model.save_pretrained(root / name, max_shard_size=shard_size)
    _write_text_encoder(root / "text_encoder")
    vae = root / "vae"
    vae.mkdir()
    save_file({"decoder.conv_in.weight": torch.randn(8, 4, 3, 3)}, str(vae / "diffusion_pytorch_model.safetensors"))
    (vae / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLMiniMaxH3"}))
    for name, (_, _, files) in NON_WEIGHT.items():
        (root / name).mkdir()
        for file, text in files.items():
            (root / name / file).write_text(text)
    entries = {**WEIGHT_COMPONENTS, **{k: v[:2] for k, v in NON_WEIGHT.items()}}
    if index_name == "modular_model_index.json":
        index = {
            "_blocks_class_name": "MiniMaxH3Blocks",
            "_class_name": "MiniMaxH3ModularPipeline",
            "_diffusers_version": "0.42.1",
            **{name: [lib, cls, {"pretrained_model_name_or_path": "MiniMaxAI/MiniMax-H3", "subfolder": name,
                                 "type_hint": [lib, cls], "revision": None, "variant": None}]
               for name, (lib, cls) in entries.items()},
        }
    else:
        index = {"_class_name": "MiniMaxH3Pipeline", "_diffusers_version": "0.42.1",
                 **{name: [lib, cls] for name, (lib, cls) in entries.items()}}
    (root / index_name).write_text(json.dumps(index, indent=2))
    return root


def _write_text_encoder(folder: Path) -> None:
    folder.mkdir()
    weight_map = {}
    generator = torch.Generator().manual_seed(1)
    for file, names in TEXT_ENCODER_SHARDS:
        tensors = {n: torch.randn(8, 16, generator=generator).to(torch.bfloat16) for n in names}
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in names})
    total = sum(8 * 16 * 2 for _ in weight_map)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    (folder / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "torch_dtype": "bfloat16"}
    ))
