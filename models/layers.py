"""Transformer building blocks shared by the DiT, its token refiner and the text encoder.

Names follow H3's checkpoint layout: `attn.to_q/to_k/to_v/to_out`, per-head
`attn.norm_q/norm_k`, `ff.fc_in` (gate and up fused) and `ff.fc_out`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for rotary positions over the axes of `positions` (N, A).

    Each axis gets an equal even share of the head (the remainder stays
    unrotated), so video patches rotate by (frame, row, column) and audio
    frames and text tokens by their own coordinates.
    """
    axes = positions.shape[-1]
    per_axis = (head_dim // axes) // 2 * 2
    angles = []
    for axis in range(axes):
        inv = theta ** (-torch.arange(0, per_axis, 2, dtype=torch.float32, device=positions.device) / per_axis)
        angles.append(positions[:, axis, None].float() * inv)
    table = torch.cat(angles, dim=-1)
    return table.cos(), table.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs of the first `2 * cos.shape[-1]` channels of x (B, H, N, D)."""
    rot = cos.shape[-1] * 2
    head, tail = x[..., :rot].float(), x[..., rot:]
    pairs = head.unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
    return torch.cat((rotated.to(x.dtype), tail), dim=-1)


class Attention(nn.Module):
    """Multi-head self-attention with per-head RMS norms on q and k and optional rotary positions."""

    def __init__(self, hidden: int, heads: int, head_dim: int, eps: float):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        self.to_q = nn.Linear(hidden, inner, bias=False)
        self.to_k = nn.Linear(hidden, inner, bias=False)
        self.to_v = nn.Linear(hidden, inner, bias=False)
        self.to_out = nn.Linear(inner, hidden, bias=False)
        self.norm_q = nn.RMSNorm(head_dim, eps=eps)
        self.norm_k = nn.RMSNorm(head_dim, eps=eps)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`key_mask` (B, N) is True for tokens that may be attended to."""
        b, n, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = self.norm_q(heads(self.to_q(x))), self.norm_k(heads(self.to_k(x))), heads(self.to_v(x))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        mask = key_mask[:, None, None, :] if key_mask is not None else None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))


class FeedForward(nn.Module):
    """SwiGLU feed-forward; `fc_in` holds gate and up projections stacked."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc_in = nn.Linear(hidden, 2 * ffn, bias=False)
        self.fc_out = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc_in(x).chunk(2, dim=-1)
        return self.fc_out(F.silu(gate) * up)


class PlainBlock(nn.Module):
    """Pre-norm attention + feed-forward block without modulation (token refiner, text encoder)."""

    def __init__(self, hidden: int, heads: int, head_dim: int, ffn: int, eps: float):
        super().__init__()
        self.norm1 = nn.RMSNorm(hidden, eps=eps)
        self.attn = Attention(hidden, heads, head_dim, eps)
        self.norm2 = nn.RMSNorm(hidden, eps=eps)
        self.ff = FeedForward(hidden, ffn)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope, key_mask)
        return x + self.ff(self.norm2(x))
