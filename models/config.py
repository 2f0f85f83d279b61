"""Component configs of the reference H3-family model and the named size profiles.

A profile fixes every shape of the four components (DiT, text encoder, video
VAE decoder, audio decoder). The configs round-trip through each component's
`config.json` (with its `_class_name`), which is how the loader rebuilds the
module on the meta device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, TypeVar

from loader.errors import DrainboardError

C = TypeVar("C", bound="_ComponentConfig")


class ProfileError(DrainboardError):
    """An unknown profile name or a config.json that does not describe the component."""


@dataclass(frozen=True)
class _ComponentConfig:
    class_name: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        """The `config.json` body, `_class_name` first."""
        return {"_class_name": self.class_name, **asdict(self)}

    @classmethod
    def from_json(cls: type[C], data: dict[str, Any]) -> C:
        """Parse a `config.json`; unknown keys are ignored, missing ones are an error."""
        known = {f.name for f in fields(cls)}
        missing = sorted(k for k in known if k not in data)
        if missing:
            raise ProfileError(f"config.json for {cls.class_name} lacks {', '.join(missing)}")
        values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in known}
        return cls(**values)


@dataclass(frozen=True)
class DiTConfig(_ComponentConfig):
    """The joint audio-video DiT (H3 layout)."""

    class_name: ClassVar[str] = "H3Transformer3DModel"

    hidden_size: int
    """Width of every token (5376 in H3)."""
    num_heads: int
    """Attention heads; `num_heads * head_dim` is the q/k/v width."""
    head_dim: int
    """Width of one head (128 in H3)."""
    num_layers: int
    """Joint transformer blocks (50 in H3)."""
    num_refiner_layers: int
    """Text token-refiner blocks (2 in H3)."""
    ffn_dim: int
    """Feed-forward inner width; `ff.fc_in` fuses gate and up, so it has 2x rows."""
    time_embed_dim: int
    """Width of the time embedding the modulation reads (2688 in H3)."""
    time_hidden_dim: int
    """Hidden width of the time MLP (5376 in H3)."""
    time_freq_dim: int
    """Sinusoidal features fed to the time MLP (256 in H3)."""
    text_dim: int
    """Width of the text encoder's output (5120 in H3)."""
    video_channels: int
    """Video latent channels (24)."""
    audio_channels: int
    """Audio latent channels (32)."""
    patch_size: tuple[int, int, int]
    """Video latent patch (t, h, w); `proj_in` reads `channels * prod(patch)` values."""
    adaln_rank: int | None
    """Rank of the shared modulation basis (`adaln_basis`), or None for full-width modulation."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    rope_theta: float = 10000.0
    """Rotary base frequency."""

    @property
    def inner_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def patch_values(self) -> int:
        t, h, w = self.patch_size
        return self.video_channels * t * h * w


@dataclass(frozen=True)
class TextEncoderConfig(_ComponentConfig):
    """A small byte-level transformer text encoder (stands in for H3's Qwen3-VL)."""

    class_name: ClassVar[str] = "H3ByteTextEncoder"

    hidden_size: int
    """Encoder width."""
    num_layers: int
    """Transformer layers."""
    num_heads: int
    """Attention heads (hidden_size must divide)."""
    ffn_dim: int
    """Feed-forward inner width (gated)."""
    out_dim: int
    """Width of the embeddings handed to the DiT (its `text_dim`)."""
    max_tokens: int
    """Longest prompt in tokens (bytes plus BOS/EOS)."""
    vocab_size: int = 259
    """256 byte values plus BOS, EOS and PAD."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""


@dataclass(frozen=True)
class VideoVAEConfig(_ComponentConfig):
    """Video VAE decoder: 24 latent channels to RGB, upsampling in time and space."""

    class_name: ClassVar[str] = "H3VideoVAEDecoder"

    latent_channels: int
    """Input channels (24)."""
    channels: int
    """Width of the decoder's feature maps."""
    temporal_factor: int
    """Frames per latent frame after the first (4): frames = 1 + factor * (latent_frames - 1)."""
    spatial_factor: int
    """Pixels per latent pixel along each side (8); a power of two."""


@dataclass(frozen=True)
class AudioVAEConfig(_ComponentConfig):
    """Audio decoder: 32 latent channels to a mono waveform through a bank of oscillators."""

    class_name: ClassVar[str] = "H3AudioVAEDecoder"

    latent_channels: int
    """Input channels (32)."""
    channels: int
    """Hidden width of the decoder."""
    oscillators: int
    """Sine oscillators whose amplitudes the latents drive."""
    sample_rate: int
    """Output samples per second."""
    latent_rate: int
    """Latent frames per second; `sample_rate` must be a multiple."""
    min_hz: float = 110.0
    """Lowest oscillator frequency."""
    max_hz: float = 1760.0
    """Highest oscillator frequency."""


@dataclass(frozen=True)
class Profile:
    """A named size of the whole model."""

    name: str
    """Profile name (`tiny`, `demo`, `h3-pruned-r16`, `h3-full`)."""
    description: str
    """One line for help texts."""
    transformer: DiTConfig
    text_encoder: TextEncoderConfig
    vae: VideoVAEConfig
    audio_vae: AudioVAEConfig
    shard_bytes: int = 5 * 10**9
    """Default shard size when writing; the demo uses small shards so `drain` (one shard held)
    and `retain` (everything held) come apart visibly on its small DiT."""

    def components(self) -> dict[str, _ComponentConfig]:
        """Component folder name -> config, in the order they are written."""
        return {
            "transformer": self.transformer,
            "text_encoder": self.text_encoder,
            "vae": self.vae,
            "audio_vae": self.audio_vae,
        }


def _h3_dit(adaln_rank: int | None) -> DiTConfig:
    return DiTConfig(
        hidden_size=5376, num_heads=56, head_dim=128, num_layers=50, num_refiner_layers=2, ffn_dim=14336,
        time_embed_dim=2688, time_hidden_dim=5376, time_freq_dim=256, text_dim=5120, video_channels=24,
        audio_channels=32, patch_size=(1, 2, 2), adaln_rank=adaln_rank,
    )


_H3_TEXT = TextEncoderConfig(hidden_size=1024, num_layers=2, num_heads=8, ffn_dim=2816, out_dim=5120, max_tokens=512)
_H3_VAE = VideoVAEConfig(latent_channels=24, channels=64, temporal_factor=4, spatial_factor=8)
_H3_AUDIO = AudioVAEConfig(latent_channels=32, channels=256, oscillators=64, sample_rate=48000, latent_rate=25)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "tiny", "a few MB; for tests",
            DiTConfig(
                hidden_size=64, num_heads=4, head_dim=16, num_layers=2, num_refiner_layers=1, ffn_dim=128,
                time_embed_dim=32, time_hidden_dim=64, time_freq_dim=32, text_dim=48, video_channels=24,
                audio_channels=32, patch_size=(1, 2, 2), adaln_rank=4,
            ),
            TextEncoderConfig(hidden_size=48, num_layers=1, num_heads=4, ffn_dim=96, out_dim=48, max_tokens=128),
            VideoVAEConfig(latent_channels=24, channels=16, temporal_factor=4, spatial_factor=8),
            AudioVAEConfig(latent_channels=32, channels=32, oscillators=16, sample_rate=16000, latent_rate=25),
        ),
        Profile(
            "demo", "a few hundred MB; the dashboard's default, a short clip on a 2-core CPU",
            DiTConfig(
                hidden_size=512, num_heads=8, head_dim=64, num_layers=8, num_refiner_layers=2, ffn_dim=1408,
                time_embed_dim=256, time_hidden_dim=512, time_freq_dim=256, text_dim=1024, video_channels=24,
                audio_channels=32, patch_size=(1, 2, 2), adaln_rank=16,
            ),
            TextEncoderConfig(hidden_size=1024, num_layers=6, num_heads=16, ffn_dim=2816, out_dim=1024, max_tokens=256),
            VideoVAEConfig(latent_channels=24, channels=32, temporal_factor=4, spatial_factor=8),
            AudioVAEConfig(latent_channels=32, channels=128, oscillators=32, sample_rate=24000, latent_rate=25),
            shard_bytes=16 * 2**20,
        ),
        Profile(
            "h3-pruned-r16", "MiniMax H3's pruned rank-16 DiT shape: 639 tensors, 20.17 B parameters",
            _h3_dit(16), _H3_TEXT, _H3_VAE, _H3_AUDIO,
        ),
        Profile(
            "h3-full", "MiniMax H3's full DiT shape: 638 tensors, 33.12 B parameters",
            _h3_dit(None), _H3_TEXT, _H3_VAE, _H3_AUDIO,
        ),
    )
}


def get_profile(name: str) -> Profile:
    """The profile called `name`; an unknown name lists the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ProfileError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None
