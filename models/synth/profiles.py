"""Named sizes of MiniMax H3's real architecture, for synthetic checkpoints.

A profile gives the constructor arguments of each diffusers / transformers
class (the classes themselves define every shape), the size of the local
tokenizer, and how the checkpoint is stored. `h3` is the released shape
(the classes' defaults and Qwen3-VL-32B); the small ones keep every
structural fact the pipeline checks (24 video / 32 audio latent channels,
16x spatial VAE, 51+ text-encoder layers) and shrink the widths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.errors import DrainboardError


class ProfileError(DrainboardError):
    """An unknown profile name or component."""


HIDDEN_STATE_LAYER = 50
"""The Qwen3-VL hidden state MiniMax H3 conditions on (`hidden_states[50]`); the encoder needs more layers."""


@dataclass(frozen=True)
class Profile:
    """One size of the whole checkpoint."""

    name: str
    """Profile name (`tiny`, `demo`, `h3`, `h3-pruned-r16`)."""
    description: str
    """One line for help texts."""
    transformer: dict[str, Any]
    """`MiniMaxH3Transformer3DModel` arguments (unset ones keep the class's release defaults)."""
    vae: dict[str, Any] = field(default_factory=dict)
    """`AutoencoderKLMiniMaxH3` arguments."""
    audio_vae: dict[str, Any] = field(default_factory=dict)
    """`AutoencoderKLMiniMaxH3Audio` arguments."""
    text_config: dict[str, Any] = field(default_factory=dict)
    """Qwen3-VL `text_config` (its `vocab_size` is set to fit the tokenizer when left out)."""
    vision_config: dict[str, Any] = field(default_factory=dict)
    """Qwen3-VL `vision_config`."""
    bpe_merges: int = 256
    """Merges of the local byte-level BPE tokenizer (vocabulary = 256 bytes + merges + Qwen's special tokens)."""
    shard_bytes: int = 5 * 10**9
    """Largest shard written."""
    components: tuple[str, ...] = ("text_encoder", "tokenizer", "processor", "transformer", "vae", "audio_vae",
                                   "scheduler", "audio_scheduler")
    """Folders written by default."""
    canvas: tuple[int, int] | None = None
    """(`canvas_short_edge`, `canvas_max_pixels`) of the pipeline's default 16:9 canvas, written into the
    model index (the short edge is also `reference_image_short_edge`); None keeps diffusers' release default
    (768, 768 x 1344; references at 2048)."""
    adaln_rank: int | None = None
    """Set for the pruned layout: the DiT's AdaLN projections read a shared rank-r basis (no diffusers class)."""

    @property
    def load_only(self) -> bool:
        """True where diffusers has no class for the DiT, so the checkpoint can be loaded but not run."""
        return self.adaln_rank is not None


_AUDIO_LATENTS = {"latents_mean": [0.0] * 32, "latents_std": [1.0] * 32}
"""The release normalises audio latents per channel; random weights get the identity."""

_QWEN3_VL_32B_TEXT = {
    "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True,
                     "rope_theta": 5000000.0},
}
_QWEN3_VL_32B_VISION = {
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 5120,
    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [8, 16, 24],
}


def _small_text(hidden: int, layers: int, heads: int, ffn: int) -> dict[str, Any]:
    head_dim = hidden // heads
    third = head_dim // 2 // 3
    section = [head_dim // 2 - 2 * third, third, third]
    return {
        "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": 1, "head_dim": head_dim, "max_position_embeddings": 4096, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "mrope_section": section, "mrope_interleaved": True,
                            "rope_theta": 500000.0},
    }


def _small_vision(hidden: int, out: int) -> dict[str, Any]:
    return {
        "depth": 1, "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_heads": 2, "out_hidden_size": out,
        "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 64,
        "deepstack_visual_indexes": [0],
    }


def _small_audio(encoder_dim: int, latent_dim: int, decoder_dim: int) -> dict[str, Any]:
    return {
        "encoder_dim": encoder_dim, "latent_dim": latent_dim, "num_attention_heads": 2, "decoder_dim": decoder_dim,
        "decoder_rates": [10, 10, 8], "decoder_kernel_sizes": [20, 20, 16], "resblock_kernel_sizes": [3],
        "resblock_dilation_sizes": [[1, 3]], **_AUDIO_LATENTS,
    }


WITH_REFERENCE_DIT = ("text_encoder", "tokenizer", "processor", "transformer", "transformer_ref", "vae", "audio_vae",
                      "scheduler", "audio_scheduler")
"""Every folder, `ref2va`'s second DiT included: what the small profiles write, so all three workflows run."""

_H3_DIT: dict[str, Any] = {}
"""The class defaults are the release: 5376 wide, 56 heads x 128, 50 blocks + 2 refiner blocks, ffn 14336."""

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "tiny", "a few MB; for tests",
            transformer={"num_attention_heads": 2, "attention_head_dim": 16, "hidden_size": 32, "num_layers": 2,
                         "num_refiner_layers": 1, "ffn_dim": 64, "text_dim": 32, "freq_dim": 32,
                         "time_embed_hidden_dim": 32, "time_embed_dim": 16, "rope_freq_dim": 2},
            vae={"block_out_channels": [8] * 6, "layers_per_block": 1, "norm_num_groups": 4, "decoder_num_layers": 1,
                 "decoder_num_attention_heads": 2, "decoder_attention_head_dim": 16, "decoder_num_register_tokens": 1},
            audio_vae=_small_audio(4, 64, 32),
            text_config=_small_text(32, HIDDEN_STATE_LAYER + 2, 2, 64),
            vision_config=_small_vision(32, 32),
            bpe_merges=64,
            shard_bytes=1 << 20,
            canvas=(64, 8192),
            components=WITH_REFERENCE_DIT,
        ),
        Profile(
            "demo", "138 MiB; the dashboard's default, a 124-frame clip in about a minute on a 2-core CPU",
            transformer={"num_attention_heads": 6, "attention_head_dim": 64, "hidden_size": 384, "num_layers": 6,
                         "num_refiner_layers": 1, "ffn_dim": 1024, "text_dim": 256, "freq_dim": 256,
                         "time_embed_hidden_dim": 384, "time_embed_dim": 192, "rope_freq_dim": 8},
            vae={"block_out_channels": [8] * 6, "layers_per_block": 1, "norm_num_groups": 4, "decoder_num_layers": 2,
                 "decoder_num_attention_heads": 2, "decoder_attention_head_dim": 16, "decoder_num_register_tokens": 1},
            audio_vae=_small_audio(4, 64, 32),
            text_config=_small_text(256, HIDDEN_STATE_LAYER + 1, 4, 512),
            vision_config=_small_vision(32, 256),
            bpe_merges=256,
            shard_bytes=16 * 2**20,
            canvas=(160, 46080),
            components=WITH_REFERENCE_DIT,
        ),
        Profile(
            "h3", "MiniMax H3's released shapes: DiT 638 tensors, 33.12 B parameters; Qwen3-VL-32B text encoder",
            transformer=_H3_DIT,
            audio_vae=_AUDIO_LATENTS,
            text_config=_QWEN3_VL_32B_TEXT,
            vision_config=_QWEN3_VL_32B_VISION,
        ),
        Profile(
            "h3-pruned-r16", "the rank-16 pruned DiT in FastVideo's converted layout: 639 tensors, 20.17 B "
            "parameters; load only (diffusers has no class for it)",
            transformer=_H3_DIT,
            components=("transformer",),
            adaln_rank=16,
        ),
    )
}


def get_profile(name: str) -> Profile:
    """The profile called `name`; an unknown name lists the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ProfileError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None
