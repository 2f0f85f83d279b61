"""LoRA files for tests, written in each layout diffusers' MiniMax H3 loader reads, for a given checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from models.checkpoint.classes import build_empty


def dit_linears(root: Path, partition: str = "transformer") -> dict[str, tuple[int, int]]:
    """Module path -> (out, in) of every Linear of the checkpoint's DiT (from its config; no weight read)."""
    module = build_empty(json.loads((root / partition / "config.json").read_text()))
    return {n: (m.out_features, m.in_features) for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)}


def random_factors(shapes: dict[str, tuple[int, int]], rank: int, seed: int,
                   dtype: torch.dtype = torch.bfloat16) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Module -> (A [rank, in], B [out, rank]), large enough to change the frames."""
    g = torch.Generator().manual_seed(seed)
    return {m: ((torch.randn(rank, i, generator=g) * 0.2).to(dtype), (torch.randn(o, rank, generator=g) * 0.2).to(dtype))
            for m, (o, i) in shapes.items()}


def write_peft_lora(path: Path, root: Path, *, rank: int = 4, seed: int = 0, prefix: str = "transformer",
                    modules=None, metadata: dict[str, str] | None = None, dtype=torch.bfloat16) -> Path:
    """diffusers/PEFT names (`transformer.<module>.lora_A.weight`), on every Linear unless `modules` is given."""
    shapes = dit_linears(root)
    if modules is not None:
        shapes = {m: shapes[m] for m in modules}
    tensors = {}
    for m, (a, b) in random_factors(shapes, rank, seed, dtype).items():
        tensors[f"{prefix}.{m}.lora_A.weight"], tensors[f"{prefix}.{m}.lora_B.weight"] = a, b
    save_file(tensors, path, metadata=metadata)
    return path


def write_diffsynth_lora(path: Path, root: Path, *, rank: int = 4, seed: int = 0) -> Path:
    """DiffSynth-Studio's layout: the original checkpoint's module names with PEFT's `.default.` infix, fp32 factors,
    and each block's fused QKV per-head interleaved (diffusers de-interleaves it; needs 128-wide heads)."""
    config = json.loads((root / "transformer" / "config.json").read_text())
    hidden, ffn = config["hidden_size"], config["ffn_dim"]
    shapes = {}
    for i in range(config["num_layers"]):
        shapes |= {f"blocks.{i}.attn.qkv_proj": (3 * hidden, hidden), f"blocks.{i}.attn.out_proj": (hidden, hidden),
                   f"blocks.{i}.mlp.fc1": (2 * ffn, hidden), f"blocks.{i}.mlp.fc2": (hidden, ffn)}
    tensors = {}
    for m, (a, b) in random_factors(shapes, rank, seed, torch.float32).items():
        tensors[f"{m}.lora_A.default.weight"], tensors[f"{m}.lora_B.default.weight"] = a, b
    save_file(tensors, path)
    return path


def write_musubi_lora(path: Path, root: Path, *, rank: int = 4, seed: int = 0, alpha: float = 2.0) -> Path:
    """musubi-tuner / kohya: flattened `lora_unet_` names, `lora_down` / `lora_up`, a per-module `.alpha` scalar."""
    config = json.loads((root / "transformer" / "config.json").read_text())
    hidden = config["hidden_size"]
    shapes = {f"lora_unet_blocks_{i}_attn_qkv_proj": (3 * hidden, hidden) for i in range(config["num_layers"])}
    tensors = {}
    for m, (a, b) in random_factors(shapes, rank, seed).items():
        tensors[f"{m}.lora_down.weight"], tensors[f"{m}.lora_up.weight"] = a, b
        tensors[f"{m}.alpha"] = torch.tensor(alpha)
    save_file(tensors, path)
    return path
