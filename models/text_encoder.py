"""A small byte-level transformer text encoder, standing in for H3's Qwen3-VL.

Bytes need no vocabulary file and no download, and every prompt maps to
tokens, so the reference model runs anywhere.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .config import TextEncoderConfig
from .layers import PlainBlock, rope_angles

BOS, EOS, PAD = 256, 257, 258
"""Special token ids after the 256 byte values."""


def tokenize(prompts: list[str], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """UTF-8 bytes framed by BOS/EOS, right-padded: ids (B, L) and mask (B, L), True on real tokens.

    Callers check lengths first (GenerateParams does); an over-long prompt here is a bug.
    """
    rows = [[BOS, *prompt.encode("utf-8"), EOS] for prompt in prompts]
    if any(len(r) > max_tokens for r in rows):
        raise ValueError(f"a prompt is longer than {max_tokens} tokens")
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = True
    return ids, mask


def prompt_tokens(prompt: str) -> int:
    """How many tokens `prompt` takes (bytes plus BOS and EOS)."""
    return len(prompt.encode("utf-8")) + 2


class H3ByteTextEncoder(nn.Module):
    """Token ids -> (B, L, out_dim) embeddings for the DiT's `context_embedder`."""

    def __init__(self, cfg: TextEncoderConfig):
        super().__init__()
        self.config = cfg
        head_dim = cfg.hidden_size // cfg.num_heads
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            PlainBlock(cfg.hidden_size, cfg.num_heads, head_dim, cfg.ffn_dim, cfg.norm_eps)
            for _ in range(cfg.num_layers)
        )
        self.final_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.proj_out = nn.Linear(cfg.hidden_size, cfg.out_dim, bias=False)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        positions = torch.arange(ids.shape[1], device=ids.device, dtype=torch.float32)[:, None]
        rope = rope_angles(positions, self.config.hidden_size // self.config.num_heads, 10000.0)
        for layer in self.layers:
            x = layer(x, rope, mask)
        return self.proj_out(self.final_norm(x))
