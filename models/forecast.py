"""What a generate run will hold, stage by stage, before any weight is read.

Per stage that computes (`text_encoder`, `denoise.denoise`, `decode.video`,
`decode.audio`): the weights resident under the resolved policy (from the
safetensors headers, at the run's dtype with H3's fp32 modules kept fp32;
with `sequential_components` only the stage's own component, otherwise all
of them), the activations from the token count of the geometry, and the
decoded frames and audio. Offloaded weights still count: they sit in host
memory, which on a unified-memory machine is the same pool.

The activation terms are deliberately simple (one layer's working set of the
packed sequence, attention scores for one head group, the VAE decoder's
widest feature map); docs/benchmarks.md records predicted vs measured per
stage on the synthetic checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loader.checkpoint import read_shard_header
from loader.device import DeviceInfo
from loader.offload import OffloadSettings, resolve_offload

from .params import FPS, TEXT_ENCODER_LAYER, WEIGHT_COMPONENTS, GenerateParams, ModelSpec
from .residency import ON_DEVICE, plan_placements

STAGE_COMPONENT = {"text_encoder": "text_encoder", "denoise.denoise": "transformer",
                   "decode.video": "vae", "decode.audio": "audio_vae"}
"""The forecast's stages and the weight component each one runs."""
AUDIO_CHANNELS, AUDIO_LATENTS_PER_SECOND = 2, 40
"""H3's stereo soundtrack and its latent rate."""


@dataclass(frozen=True)
class StageForecast:
    """Predicted bytes held during one stage."""

    stage: str
    """Pipeline block name."""
    weight_bytes: int
    """Weights resident anywhere (device or host) during the stage."""
    device_weight_bytes: int
    """Of those, on the device while the stage computes (all of them on unified memory or a CPU)."""
    activation_bytes: int
    """Working set of the stage's forward."""
    output_bytes: int
    """What the stage leaves behind: embeddings, latents, decoded frames or audio."""

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.activation_bytes + self.output_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class GenerateForecast:
    """A whole run's forecast."""

    height: int
    """Pixels."""
    width: int
    """Pixels."""
    tokens: int
    """Rows of the packed sequence the DiT attends over (text + audio + video patches)."""
    sequential_components: bool
    """Whether the forecast assumes per-stage residency."""
    component_bytes: dict[str, int]
    """Each weight component's bytes at the run's dtype."""
    placements: dict[str, str]
    """Component -> diffusers mechanism under the resolved policy."""
    stages: list[StageForecast] = field(default_factory=list)
    """One entry per computing stage, in run order."""

    @property
    def predicted_peak_bytes(self) -> int:
        return max((s.total_bytes for s in self.stages), default=0)

    @property
    def peak_stage(self) -> str:
        return max(self.stages, key=lambda s: s.total_bytes).stage if self.stages else ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "height": self.height, "width": self.width, "tokens": self.tokens,
            "sequential_components": self.sequential_components, "component_bytes": dict(self.component_bytes),
            "placements": dict(self.placements), "stages": [s.to_dict() for s in self.stages],
            "predicted_peak_bytes": self.predicted_peak_bytes, "peak_stage": self.peak_stage,
        }


def forecast_generate(
    root: str | Path,
    params: GenerateParams,
    *,
    device_info: DeviceInfo,
    settings: OffloadSettings,
    dtype_bytes: int = 2,
    sequential_components: bool | None = None,
) -> GenerateForecast:
    """Forecast a t2va run of `params` on the model at `root` under `settings` resolved for `device_info`.

    Reads configs and safetensors headers only. `sequential_components`
    defaults as `run_generate` does (on for unified memory).
    """
    import torch

    root = Path(root)
    model = ModelSpec.read(root)
    resolved, _ = resolve_offload(settings, device_info)
    sequential = device_info.unified_memory if sequential_components is None else sequential_components
    device = torch.device("cpu" if device_info.kind == "cpu" else "cuda")
    placements = plan_placements(resolved, device, WEIGHT_COMPONENTS)
    sizes = {name: component_bytes(root / name, _keep_fp32(root, name), dtype_bytes) for name in WEIGHT_COMPONENTS}
    height, width = model.geometry(params)
    dit = model.configs["transformer"]
    text_hidden = int(model.configs["text_encoder"]["text_config"]["hidden_size"])
    video_latents = _video_latents(params.frames, model) * (height // model.spatial_compression) * (
        width // model.spatial_compression)
    latent_channels = int(model.configs["vae"].get("latent_channels", 24))
    patch = math.prod(int(p) for p in dit["patch_size"])
    audio_rows = round(params.frames / FPS * AUDIO_LATENTS_PER_SECOND) * AUDIO_CHANNELS
    text_tokens = len(params.prompt.encode()) + 16
    tokens = text_tokens + audio_rows + video_latents // patch
    hidden, ffn, heads = int(dit["hidden_size"]), int(dit["ffn_dim"]), int(dit["num_attention_heads"])
    pixels = params.frames * height * width
    samples = round(params.frames / FPS * model.sampling_rate)
    latents_out = (video_latents * latent_channels + audio_rows * 32) * 4
    work = {
        # Qwen3-VL over the prompt: a layer's hidden states, all hidden states kept (output_hidden_states).
        "text_encoder": (text_tokens * text_hidden * dtype_bytes * (model.text_encoder_layers + 8),
                         text_tokens * text_hidden * dtype_bytes),
        # One joint block over the packed sequence: q, k, v, out, the fused SwiGLU, and one score matrix.
        "denoise.denoise": (tokens * (6 * hidden + 3 * ffn) * dtype_bytes + heads * tokens * tokens * 4,
                            latents_out),
        # The ViT decoder's patch tokens at the widest width, then float32 RGB frames.
        "decode.video": (pixels * 3 * 4 * 4 + video_latents * 4 * 64, pixels * 3 * 4),
        # The BigVGAN decoder's feature maps at the output rate, both channels as a batch of two (the
        # constant, 192 float32 values per output sample and channel, is fitted to the demo on a CPU).
        "decode.audio": (samples * AUDIO_CHANNELS * 4 * 192, samples * AUDIO_CHANNELS * 4),
    }
    stages = []
    carried = 0
    for stage, component in STAGE_COMPONENT.items():
        if stage == "decode.audio" and not params.audio:
            continue
        resident = [component] if sequential else list(WEIGHT_COMPONENTS)
        weights = sum(sizes[c] for c in resident)
        on_device = sum(sizes[c] for c in resident if placements[c].mechanism == ON_DEVICE)
        if placements[component].mechanism != ON_DEVICE:
            on_device += sizes[component] if component != "transformer" or not resolved.dit_layerwise_offload \
                else sizes[component] // max(int(dit["num_layers"]), 1)
        activations, output = work[stage]
        stages.append(StageForecast(stage, weights, on_device, activations, carried + output))
        carried += output if stage.startswith("decode") else 0
    return GenerateForecast(height, width, tokens, sequential, sizes,
                            {c: p.mechanism for c, p in placements.items()}, stages)


def _keep_fp32(root: Path, name: str) -> tuple[str, ...]:
    """The component class's `_keep_in_fp32_modules` (diffusers' dtype rule), from the index's class name."""
    import importlib
    import json

    library, class_name = json.loads((root / "modular_model_index.json").read_text())[name][:2]
    cls = getattr(importlib.import_module(library), class_name)
    return tuple(getattr(cls, "_keep_in_fp32_modules", None) or ())


def _video_latents(frames: int, model: ModelSpec) -> int:
    """Latent frames the video VAE makes of `frames` (5n + 2 for 17n + 5)."""
    return (frames - model.latents_per_chunk) // model.frames_per_chunk * model.latents_per_chunk + 2


def unread_by_t2va(name: str) -> bool:
    """Text-encoder tensors t2va never reads: the vision tower, the LM head, and the decoder layers after
    layer 50 (layers 0..50 stay, so `hidden_states[50]` remains the pre-norm state; the loader's rule)."""
    if name.startswith(("model.visual.", "lm_head.")):
        return True
    prefix = "model.language_model.layers."
    return name.startswith(prefix) and int(name[len(prefix):].split(".", 1)[0]) > TEXT_ENCODER_LAYER


def component_bytes(folder: Path, keep_fp32: tuple[str, ...], dtype_bytes: int) -> int:
    """Bytes of a component's tensors at the run's dtype: fp32 where diffusers keeps fp32 (a dotted part of
    the name in `_keep_in_fp32_modules`), else `dtype_bytes`; tensors t2va never reads are not counted."""
    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        shard, problems = read_shard_header(path)
        if shard is None:
            raise ValueError(f"{path}: " + "; ".join(problems))
        for t in shard.tensors:
            if folder.name == "text_encoder" and unread_by_t2va(t.name):
                continue
            if not t.dtype.startswith(("F", "BF")):
                total += t.nbytes
            elif any(part in keep_fp32 for part in t.name.split(".")):
                total += t.numel * 4
            else:
                total += t.numel * dtype_bytes
    return total
