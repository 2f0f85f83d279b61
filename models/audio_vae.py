"""Audio decoder: 32-channel latents to a mono waveform.

A latent frame sets the loudness of a bank of sine oscillators (log-spaced
between `min_hz` and `max_hz`); loudness is interpolated to the sample rate,
so the sound changes smoothly with the latents, like a tiny DDSP synthesiser.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import AudioVAEConfig


def audio_latent_frames(seconds: float, latent_rate: int) -> int:
    """Latent frames covering `seconds` of audio (at least one)."""
    return max(1, math.ceil(seconds * latent_rate))


class H3AudioVAEDecoder(nn.Module):
    """Latents (B, 32, L) -> waveform (B, L * sample_rate / latent_rate) in [-1, 1]."""

    def __init__(self, cfg: AudioVAEConfig):
        super().__init__()
        if cfg.sample_rate % cfg.latent_rate:
            raise ValueError("sample_rate must be a multiple of latent_rate")
        self.config = cfg
        self.conv_in = nn.Conv1d(cfg.latent_channels, cfg.channels, kernel_size=3, padding=1)
        self.conv_out = nn.Conv1d(cfg.channels, cfg.oscillators, kernel_size=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        hop = cfg.sample_rate // cfg.latent_rate
        loudness = F.softplus(self.conv_out(F.silu(self.conv_in(z.to(self.conv_in.weight.dtype))))).float()
        samples = z.shape[-1] * hop
        loudness = F.interpolate(loudness, size=samples, mode="linear", align_corners=False)
        hz = torch.logspace(math.log10(cfg.min_hz), math.log10(cfg.max_hz), cfg.oscillators, device=z.device)
        time = torch.arange(samples, device=z.device, dtype=torch.float32) / cfg.sample_rate
        bank = torch.sin(2 * math.pi * hz[:, None] * time[None, :])
        wave = (loudness * bank).sum(dim=1) / cfg.oscillators
        return torch.tanh(wave)
