"""The reference joint audio-video DiT with H3's module names and layout.

One packed sequence per sample: refined text tokens | audio frames | video
patches. Every joint block modulates each modality with its own six vectors
(shift/scale/gate for attention and feed-forward: 18 x hidden outputs of
`adaln_proj.linear`), read from the time embedding, or, in the pruned layout,
from a shared rank-r basis of it (`adaln_basis`).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import DiTConfig
from .layers import Attention, FeedForward, PlainBlock, rope_angles

MODALITIES = 3
"""Modulation groups, in sequence order: text, audio, video."""


def timestep_features(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features of flow time `t` in [0, 1] (scaled to 0..1000 like diffusion steps)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = (t.float() * 1000.0)[:, None] * freqs
    return torch.cat((args.cos(), args.sin()), dim=-1)


class TimeEmbedder(nn.Module):
    """Flow time -> `time_embed_dim` vector through a two-layer MLP."""

    def __init__(self, freq_dim: int, hidden: int, out: int):
        super().__init__()
        self.freq_dim = freq_dim
        self.linear_1 = nn.Linear(freq_dim, hidden)
        self.linear_2 = nn.Linear(hidden, out)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        features = timestep_features(t, self.freq_dim).to(self.linear_1.weight.dtype)
        return self.linear_2(F.silu(self.linear_1(features)))


class AdaLNProjection(nn.Module):
    """Per-block modulation: `linear` maps the conditioning vector to 18 x hidden."""

    def __init__(self, cond_dim: int, hidden: int):
        super().__init__()
        self.linear = nn.Linear(cond_dim, MODALITIES * 6 * hidden)


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class JointBlock(nn.Module):
    """A joint transformer block over the packed text | audio | video sequence."""

    def __init__(self, cfg: DiTConfig, cond_dim: int):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = Attention(cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.norm_eps)
        self.norm2 = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.ff = FeedForward(cfg.hidden_size, cfg.ffn_dim)
        self.adaln_proj = AdaLNProjection(cond_dim, cfg.hidden_size)

    def forward(
        self,
        x: torch.Tensor,
        cond: torch.Tensor,
        lengths: tuple[int, int, int],
        rope: tuple[torch.Tensor, torch.Tensor],
        key_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        mods = self.adaln_proj.linear(cond).unflatten(-1, (MODALITIES, 6, -1))

        def per_modality(h: torch.Tensor, first: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
            parts = h.split(lengths, dim=1)
            gates = [mods[:, m, first + 2] for m in range(MODALITIES)]
            return torch.cat(
                [_modulate(p, mods[:, m, first], mods[:, m, first + 1]) for m, p in enumerate(parts)], dim=1
            ), gates

        def gated(update: torch.Tensor, gates: list[torch.Tensor]) -> torch.Tensor:
            parts = update.split(lengths, dim=1)
            return torch.cat([p * g[:, None] for p, g in zip(parts, gates)], dim=1)

        h, gates = per_modality(self.norm1(x), 0)
        x = x + gated(self.attn(h, rope, key_mask), gates)
        h, gates = per_modality(self.norm2(x), 3)
        return x + gated(self.ff(h), gates)


class TokenRefiner(nn.Module):
    """Refines the embedded text tokens before they join the sequence."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.refiner_blocks = nn.ModuleList(
            PlainBlock(cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.ffn_dim, cfg.norm_eps)
            for _ in range(cfg.num_refiner_layers)
        )
        self.final_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        for block in self.refiner_blocks:
            x = block(x, None, key_mask)
        return self.final_norm(x)


class NormOut(nn.Module):
    """Final RMS norm with a shift/scale modulation from the conditioning vector."""

    def __init__(self, cond_dim: int, hidden: int, eps: float):
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.linear = nn.Linear(cond_dim, 2 * hidden)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        shift, scale = self.linear(cond).chunk(2, dim=-1)
        return _modulate(self.norm(x), shift, scale)


class H3Transformer3DModel(nn.Module):
    """Predicts the flow velocity of video and audio latents given text and time."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.config = cfg
        cond_dim = cfg.adaln_rank or cfg.time_embed_dim
        self.proj_in = nn.Linear(cfg.patch_values, cfg.hidden_size)
        self.audio_proj_in = nn.Linear(cfg.audio_channels, cfg.hidden_size)
        self.context_embedder = nn.Linear(cfg.text_dim, cfg.hidden_size)
        self.time_embedder = TimeEmbedder(cfg.time_freq_dim, cfg.time_hidden_dim, cfg.time_embed_dim)
        if cfg.adaln_rank:
            self.adaln_basis = nn.Linear(cfg.time_embed_dim, cfg.adaln_rank, bias=False)
        self.token_refiner = TokenRefiner(cfg)
        self.transformer_blocks = nn.ModuleList(JointBlock(cfg, cond_dim) for _ in range(cfg.num_layers))
        self.norm_out = NormOut(cond_dim, cfg.hidden_size, cfg.norm_eps)
        self.proj_out = nn.Linear(cfg.hidden_size, cfg.patch_values)
        self.audio_proj_out = nn.Linear(cfg.hidden_size, cfg.audio_channels)

    def conditioning(self, t: torch.Tensor) -> torch.Tensor:
        """The vector every modulation reads: silu(time embedding), through the basis when pruned."""
        cond = F.silu(self.time_embedder(t))
        return self.adaln_basis(cond) if self.config.adaln_rank else cond

    def forward(
        self,
        video: torch.Tensor,
        audio: torch.Tensor,
        text: torch.Tensor,
        t: torch.Tensor,
        text_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """video (B, C, T, H, W), audio (B, Ca, L), text (B, Lt, text_dim), t (B,) -> velocities shaped like the inputs."""
        cfg = self.config
        b, c, frames, height, width = video.shape
        pt, ph, pw = cfg.patch_size
        gt, gh, gw = frames // pt, height // ph, width // pw
        dtype = self.proj_in.weight.dtype
        patches = (
            video.reshape(b, c, gt, pt, gh, ph, gw, pw)
            .permute(0, 2, 4, 6, 1, 3, 5, 7)
            .reshape(b, gt * gh * gw, c * pt * ph * pw)
        )
        video_tokens = self.proj_in(patches.to(dtype))
        audio_tokens = self.audio_proj_in(audio.transpose(1, 2).to(dtype))
        text_tokens = self.token_refiner(self.context_embedder(text.to(dtype)), text_mask)
        lengths = (text_tokens.shape[1], audio_tokens.shape[1], video_tokens.shape[1])
        x = torch.cat((text_tokens, audio_tokens, video_tokens), dim=1)
        rope = rope_angles(self._positions(lengths, (gt, gh, gw), video.device), cfg.head_dim, cfg.rope_theta)
        key_mask = None
        if text_mask is not None:
            key_mask = torch.cat((text_mask, text_mask.new_ones(b, lengths[1] + lengths[2])), dim=1)
        cond = self.conditioning(t).to(dtype)
        for block in self.transformer_blocks:
            x = block(x, cond, lengths, rope, key_mask)
        x = self.norm_out(x, cond)
        _, audio_out, video_out = x.split(lengths, dim=1)
        video_v = (
            self.proj_out(video_out)
            .reshape(b, gt, gh, gw, c, pt, ph, pw)
            .permute(0, 4, 1, 5, 2, 6, 3, 7)
            .reshape(b, c, frames, height, width)
        )
        audio_v = self.audio_proj_out(audio_out).transpose(1, 2)
        return video_v.float(), audio_v.float()

    @staticmethod
    def _positions(lengths: tuple[int, int, int], grid: tuple[int, int, int], device: torch.device) -> torch.Tensor:
        """(N, 3) rotary coordinates: text before the clip in time, audio frames on the video's
        latent-frame clock, video patches at (frame, row, column)."""
        n_text, n_audio, _ = lengths
        gt, gh, gw = grid
        text = torch.zeros(n_text, 3, device=device)
        text[:, 0] = torch.arange(-n_text, 0, device=device)
        audio = torch.zeros(n_audio, 3, device=device)
        audio[:, 0] = torch.arange(n_audio, device=device) * (gt / max(n_audio, 1))
        tt, hh, ww = torch.meshgrid(
            torch.arange(gt, device=device), torch.arange(gh, device=device), torch.arange(gw, device=device),
            indexing="ij",
        )
        video = torch.stack((tt, hh, ww), dim=-1).reshape(-1, 3).float()
        return torch.cat((text, audio, video))
