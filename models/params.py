"""Generate parameters and their validation against a model folder.

Validation reads only the components' `config.json` and safetensors headers,
so a job can be refused in the parent process before any weight is read.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from loader.errors import DrainboardError

from .config import AudioVAEConfig, DiTConfig, TextEncoderConfig, VideoVAEConfig
from .audio_vae import audio_latent_frames
from .text_encoder import prompt_tokens


class GenerateParamsError(DrainboardError):
    """One or more generate parameters cannot be used with this model."""

    def __init__(self, problems: dict[str, str]):
        self.problems = problems
        """Field name -> what is wrong with it."""
        super().__init__("; ".join(self.messages()))

    def messages(self) -> list[str]:
        return [f"{k}: {v}" for k, v in sorted(self.problems.items())]


@dataclass(frozen=True)
class GenerateParams:
    """What to generate."""

    prompt: str
    """Text describing the clip."""
    negative_prompt: str = ""
    """Text the guidance steers away from."""
    frames: int = 25
    """Frames of video; 1 + temporal_factor * k (25 = 1 + 4 * 6)."""
    height: int = 112
    """Pixels; a multiple of the VAE factor times the patch size (16 for H3)."""
    width: int = 192
    """Pixels; a multiple of the VAE factor times the patch size (16 for H3)."""
    steps: int = 6
    """Denoising steps of the flow-matching Euler sampler."""
    guidance_scale: float = 4.0
    """Classifier-free guidance; 1.0 runs the conditional branch only."""
    seed: int = 0
    """Seed of the initial noise; the same seed gives the same clip."""
    fps: int = 24
    """Frames per second of the MP4."""
    audio: bool = True
    """Generate and encode an audio track."""

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def duration(self) -> float:
        """Seconds of video."""
        return self.frames / self.fps


@dataclass(frozen=True)
class ModelSpec:
    """The parts of a model folder's configs that constrain generate parameters."""

    transformer: DiTConfig
    text_encoder: TextEncoderConfig
    vae: VideoVAEConfig
    audio_vae: AudioVAEConfig
    weight_bytes: dict[str, int]
    """Stored bytes per component, from the safetensors index files."""

    @classmethod
    def read(cls, model_dir: str | os.PathLike) -> "ModelSpec":
        """Read the four components' config.json (and index sizes) from `model_dir`."""
        root = Path(model_dir)
        configs = {}
        sizes = {}
        for name, kind in (("transformer", DiTConfig), ("text_encoder", TextEncoderConfig),
                           ("vae", VideoVAEConfig), ("audio_vae", AudioVAEConfig)):
            path = root / name / "config.json"
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise GenerateParamsError({"model": f"cannot read {path}: {exc}"}) from None
            if data.get("_class_name") != kind.class_name:
                raise GenerateParamsError(
                    {"model": f"{path} has _class_name {data.get('_class_name')!r}; expected {kind.class_name!r}"}
                )
            configs[name] = kind.from_json(data)
            sizes[name] = sum(_index_size(p) for p in (root / name).glob("*.safetensors.index.json"))
        return cls(**configs, weight_bytes=sizes)

    @property
    def pixel_multiple(self) -> int:
        """Height and width must be multiples of this (VAE factor times patch)."""
        return self.vae.spatial_factor * math.lcm(self.transformer.patch_size[1], self.transformer.patch_size[2])


def _index_size(path: Path) -> int:
    try:
        return int(json.loads(path.read_text()).get("metadata", {}).get("total_size", 0))
    except (OSError, ValueError, TypeError):
        return 0


def estimate_bytes(params: GenerateParams, model: ModelSpec, dtype_bytes: int) -> int:
    """A rough peak for the run: every weight once in `dtype_bytes`, plus the largest activations
    (attention scores of the joint sequence for both guidance branches, and the decoded video in fp32)."""
    dit = model.transformer
    weights = sum(model.weight_bytes.values()) // 2 * dtype_bytes
    latent_frames = (params.frames - 1) // model.vae.temporal_factor + 1
    video_tokens = latent_frames * (params.height // model.pixel_multiple) * (params.width // model.pixel_multiple)
    audio_tokens = audio_latent_frames(params.duration, model.audio_vae.latent_rate) if params.audio else 0
    tokens = video_tokens + audio_tokens + prompt_tokens(params.prompt)
    branches = 2 if params.guidance_scale != 1.0 else 1
    attention = branches * dit.num_heads * tokens * tokens * 4
    hidden = branches * tokens * max(dit.hidden_size, 2 * dit.ffn_dim) * 4 * 4
    decoded = params.frames * params.height * params.width * (model.vae.channels + 3) * 4
    return weights + attention + hidden + decoded


def validate_params(params: GenerateParams, model: ModelSpec, *, available_bytes: int | None = None, dtype_bytes: int = 4) -> None:
    """Raise GenerateParamsError naming every field the model cannot take.

    `available_bytes`, when given, is compared with `estimate_bytes`.
    """
    problems: dict[str, str] = {}
    multiple = model.pixel_multiple
    if not params.prompt.strip():
        problems["prompt"] = "must not be empty"
    for field, text in (("prompt", params.prompt), ("negative_prompt", params.negative_prompt)):
        tokens = prompt_tokens(text)
        if tokens > model.text_encoder.max_tokens:
            problems[field] = (
                f"{tokens} tokens (UTF-8 bytes + 2); this text encoder takes at most {model.text_encoder.max_tokens}"
            )
    tf = model.vae.temporal_factor
    if params.frames < 1 or (params.frames - 1) % tf:
        problems["frames"] = f"{params.frames} is not 1 + {tf} * k (e.g. {1 + tf * 8} or {1 + tf * 30})"
    for field in ("height", "width"):
        value = getattr(params, field)
        if value < multiple or value % multiple:
            problems[field] = f"{value} is not a positive multiple of {multiple} (VAE factor x patch size)"
    if not 1 <= params.steps <= 200:
        problems["steps"] = f"{params.steps} is outside 1..200"
    if not 1.0 <= params.guidance_scale <= 30.0:
        problems["guidance_scale"] = f"{params.guidance_scale} is outside 1.0..30.0"
    if not 1 <= params.fps <= 120:
        problems["fps"] = f"{params.fps} is outside 1..120"
    if not 0 <= params.seed < 2**63:
        problems["seed"] = f"{params.seed} is outside 0..2**63-1"
    if not problems and available_bytes is not None:
        need = estimate_bytes(params, model, dtype_bytes)
        if need > available_bytes:
            problems["frames"] = (
                f"{params.frames} frames at {params.width}x{params.height} need about {need / 2**30:.1f} GiB"
                f" by a simple estimate; {available_bytes / 2**30:.1f} GiB are available (use fewer frames or pixels)"
            )
    if problems:
        raise GenerateParamsError(problems)
