"""Video VAE decoder: 24-channel latents to RGB frames, upsampled in time and space.

Frames follow the causal-VAE count: `1 + temporal_factor * (latent_frames - 1)`.
Each up stage doubles the spatial size (and, for the first log2(temporal_factor)
stages, the frame rate) by interpolation and then mixes with a convolution.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import VideoVAEConfig


def stage_channels(cfg: VideoVAEConfig) -> list[int]:
    """Feature width before the first up stage and after each one (halving, at least 8)."""
    stages = cfg.spatial_factor.bit_length() - 1
    return [max(cfg.channels >> i, 8) for i in range(stages + 1)]


def decoded_frames(latent_frames: int, temporal_factor: int) -> int:
    """Frames a clip of `latent_frames` decodes to."""
    return 1 + temporal_factor * (latent_frames - 1)


class UpStage(nn.Module):
    """Interpolate (x2 in space, optionally in time), then a 3x3 spatial convolution."""

    def __init__(self, c_in: int, c_out: int, temporal: bool):
        super().__init__()
        self.temporal = temporal
        self.conv = nn.Conv3d(c_in, c_out, kernel_size=(1, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames, height, width = x.shape[2:]
        size = (2 * frames - 1 if self.temporal and frames > 1 else frames, 2 * height, 2 * width)
        x = F.interpolate(x, size=size, mode="trilinear", align_corners=True)
        return self.conv(F.pad(x, (1, 1, 1, 1, 0, 0), mode="replicate"))


class H3VideoVAEDecoder(nn.Module):
    """Latents (B, 24, T, h, w) -> RGB in [-1, 1] (B, 3, 1 + 4(T-1), 8h, 8w)."""

    def __init__(self, cfg: VideoVAEConfig):
        super().__init__()
        if cfg.spatial_factor & (cfg.spatial_factor - 1) or cfg.temporal_factor & (cfg.temporal_factor - 1):
            raise ValueError("VAE factors must be powers of two")
        self.config = cfg
        widths = stage_channels(cfg)
        temporal_stages = cfg.temporal_factor.bit_length() - 1
        self.conv_in = nn.Conv3d(cfg.latent_channels, widths[0], kernel_size=3)
        self.up_blocks = nn.ModuleList(
            UpStage(widths[i], widths[i + 1], temporal=i < temporal_stages) for i in range(len(widths) - 1)
        )
        self.conv_out = nn.Conv3d(widths[-1], 3, kernel_size=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(F.pad(z.to(self.conv_in.weight.dtype), (1, 1, 1, 1, 1, 1), mode="replicate"))
        for stage in self.up_blocks:
            x = stage(x)
        return torch.tanh(self.conv_out(x)).float()
