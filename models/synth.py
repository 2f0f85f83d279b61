"""Deterministic synthetic checkpoints of the reference model, in the diffusers layout.

`synth_checkpoint` writes `model_index.json` and one folder per component
(`config.json`, sharded `*.safetensors`, `*.safetensors.index.json`). Shapes
come from the module built on the meta device, so the files always match the
code. Values come from a generator seeded by (seed, tensor name, chunk), made
in parallel chunks and streamed to disk: memory stays at a few chunks and the
37 GiB pruned DiT writes at about disk speed.

The weights are synthetic, but not noise: the video decoder is built from
smoothing kernels and a colour mix, so the demo shows smooth colour fields
that morph over time, and the DiT's small random weights move the latents
with the prompt and the seed. It is not MiniMax H3 (see `h3synth` for the real architecture).
"""

from __future__ import annotations

import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from safetensors import safe_open

from loader.diskspace import free_bytes, is_disk_full, require_space
from loader.errors import DiskFullError

from .config import Profile, ProfileError, _ComponentConfig
from .registry import build_component
from .safetensors_stream import TensorSpec, chunk_generator, header_bytes, plan_shards, random_chunks, write_safetensors

_STEMS = {"transformer": "diffusion_pytorch_model", "vae": "diffusion_pytorch_model",
          "audio_vae": "diffusion_pytorch_model", "text_encoder": "model"}


@dataclass
class ComponentPlan:
    """What one component's folder holds (or would hold)."""

    name: str
    """Folder name."""
    class_name: str
    """`_class_name` in its config.json."""
    tensors: int
    """Tensor count."""
    parameters: int
    """Sum of numel."""
    bytes: int
    """Tensor bytes in the stored dtype."""
    shards: int
    """Number of safetensors files."""


@dataclass
class SynthReport:
    """The result of a synth run (or a dry run)."""

    path: str
    """Model folder."""
    profile: str
    """Profile name."""
    dtype: str
    """Stored floating dtype."""
    seed: int
    """Seed of every value."""
    components: list[ComponentPlan] = field(default_factory=list)
    """One entry per component."""
    written: bool = False
    """False for a dry run."""

    def to_dict(self) -> dict:
        return asdict(self)


def component_specs(cfg: _ComponentConfig, dtype: torch.dtype) -> list[TensorSpec]:
    """Every tensor of the component, in state-dict order, from the module built on meta."""
    with torch.device("meta"):
        module = build_component(cfg)
    return [TensorSpec(name, tuple(t.shape), dtype) for name, t in module.state_dict().items()]


def plan_synth(
    profile: Profile, dtype: torch.dtype, shard_bytes: int, components: Sequence[str] | None = None
) -> list[tuple[str, _ComponentConfig, list[list[TensorSpec]]]]:
    """(component, config, shards) for each component of `profile` (or only those named)."""
    known = profile.components()
    unknown = sorted(set(components or ()) - set(known))
    if unknown:
        raise ProfileError(f"unknown component(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [
        (name, cfg, plan_shards(component_specs(cfg, dtype), shard_bytes))
        for name, cfg in known.items()
        if components is None or name in components
    ]


def synth_checkpoint(
    out: str | os.PathLike,
    profile: Profile,
    *,
    dtype: torch.dtype = torch.bfloat16,
    shard_bytes: int | None = None,
    seed: int = 0,
    components: Sequence[str] | None = None,
    dry_run: bool = False,
    workers: int | None = None,
    on_bytes: Callable[[int, int], None] | None = None,
) -> SynthReport:
    """Write (or, with `dry_run`, only plan) the checkpoint of `profile` into `out`.

    `components` limits the folders written (e.g. only `transformer`).
    `shard_bytes` defaults to the profile's (5 GB; 16 MiB for `demo`).

    `on_bytes(done, total)` follows the bytes written. Each written shard is
    reopened with `safetensors.safe_open` to check its header.
    """
    root = Path(out)
    plan = plan_synth(profile, dtype, shard_bytes or profile.shard_bytes, components)
    report = SynthReport(str(root), profile.name, str(dtype).removeprefix("torch."), seed, written=not dry_run)
    for name, cfg, shards in plan:
        specs = [s for shard in shards for s in shard]
        report.components.append(
            ComponentPlan(name, cfg.class_name, len(specs), sum(s.numel for s in specs),
                          sum(s.nbytes for s in specs), len(shards))
        )
    if dry_run:
        return report
    total = sum(c.bytes for c in report.components)
    headers = sum(len(header_bytes(shard)) for _, _, shards in plan for shard in shards)
    replaced = sum(path.stat().st_size for path in _shard_paths(root, plan) if path.is_file())
    require_space(root, total + headers - replaced, f"the {profile.name} checkpoint")
    done = 0

    def count(n: int) -> None:
        nonlocal done
        done += n
        if on_bytes is not None:
            on_bytes(done, total)

    root.mkdir(parents=True, exist_ok=True)
    touched: list[Path] = []
    """Files this run opened for writing, in order; the last is the one being written."""
    try:
        _write_plan(root, plan, profile, seed, workers, count, touched)
    except OSError as e:
        if not is_disk_full(e):
            raise
        for path in touched:
            path.unlink(missing_ok=True)
        raise DiskFullError(
            f"disk full while writing {touched[-1] if touched else root}: {done:,} of {total:,} tensor bytes written, "
            f"{free_bytes(root):,} bytes free; removed the {len(touched)} file(s) this run wrote"
        ) from e
    return report


def _write_plan(
    root: Path, plan: list[tuple[str, _ComponentConfig, list[list[TensorSpec]]]], profile: Profile, seed: int,
    workers: int | None, count: Callable[[int], None], touched: list[Path],
) -> None:
    """Write every planned component, then `model_index.json`.

    Indexes are written after what they list and removed before it is replaced, so an
    index on disk always means complete. Each file is appended to `touched` before it
    is opened, so a failed run knows exactly what it wrote.
    """
    (root / "model_index.json").unlink(missing_ok=True)
    index = {"_class_name": "H3AudioVideoPipeline", "_drainboard_profile": profile.name, "_drainboard_seed": seed}
    with ThreadPoolExecutor(max_workers=workers or min(16, os.cpu_count() or 1)) as pool:
        for name, cfg, shards in plan:
            folder = root / name
            folder.mkdir(exist_ok=True)
            stem = _STEMS[name]
            index_path = folder / f"{stem}.safetensors.index.json"
            index_path.unlink(missing_ok=True)
            touched.append(folder / "config.json")
            touched[-1].write_text(json.dumps(cfg.to_json(), indent=2) + "\n")
            weight_map = {}
            for i, shard in enumerate(shards, 1):
                touched.append(folder / _shard_name(stem, i, len(shards)))
                write_safetensors(touched[-1], shard, lambda spec: _values(pool, cfg, spec, seed), on_bytes=count)
                _check_readable(touched[-1], shard)
                weight_map.update({spec.name: touched[-1].name for spec in shard})
            size = sum(spec.nbytes for shard in shards for spec in shard)
            touched.append(index_path)
            index_path.write_text(json.dumps({"metadata": {"total_size": size}, "weight_map": weight_map}, indent=2) + "\n")
            index[name] = ["drainboard.models", cfg.class_name]
    touched.append(root / "model_index.json")
    touched[-1].write_text(json.dumps(index, indent=2) + "\n")


def _shard_name(stem: str, i: int, n: int) -> str:
    return f"{stem}-{i:05d}-of-{n:05d}.safetensors"


def _shard_paths(root: Path, plan: list[tuple[str, _ComponentConfig, list[list[TensorSpec]]]]) -> Iterator[Path]:
    """Every shard file the plan writes (an existing one is replaced, so its space counts as free)."""
    for name, _, shards in plan:
        for i in range(1, len(shards) + 1):
            yield root / name / _shard_name(_STEMS[name], i, len(shards))


def _check_readable(path: Path, shard: list[TensorSpec]) -> None:
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
    expected = {s.name for s in shard}
    if keys != expected:
        raise RuntimeError(f"{path}: safe_open lists {len(keys)} tensors, expected {len(expected)}")


def _values(pool: ThreadPoolExecutor, cfg: _ComponentConfig, spec: TensorSpec, seed: int) -> Iterator[torch.Tensor]:
    """The tensor's values as chunks in `spec.dtype`, generated ahead on the pool."""
    structured = _structured(cfg, spec, seed)
    if structured is not None:
        yield structured.to(spec.dtype).reshape(-1)
        return
    yield from random_chunks(pool, spec, seed, _std(cfg, spec) * math.sqrt(3.0))


def _fan_in(shape: tuple[int, ...]) -> int:
    return math.prod(shape[1:]) if len(shape) > 1 else shape[0]


def _std(cfg: _ComponentConfig, spec: TensorSpec) -> float:
    """Uniform-init standard deviation of a plain random tensor, by name."""
    name, shape = spec.name, spec.shape
    if name.endswith(".bias"):
        return 0.02
    if "embed_tokens" in name:
        return 1.0
    if "adaln_proj" in name or "norm_out.linear" in name:
        return 0.1 / math.sqrt(_fan_in(shape))
    if name.startswith("proj_out") or name.startswith("audio_proj_out"):
        return 0.3 / math.sqrt(_fan_in(shape))
    return 1.0 / math.sqrt(_fan_in(shape))


_GATE_BIAS = 0.25
"""Gate of every joint block's attention and feed-forward updates, for every modality."""

_TEXT_VALUE_GAIN = 16.0
"""Scale of the text tokens' attention input: per-head q/k norms cancel it in the attention
weights, so it only makes the few text tokens' values loud enough to colour the clip."""


def _structured(cfg: _ComponentConfig, spec: TensorSpec, seed: int) -> torch.Tensor | None:
    """Designed values (norms, modulation biases, decoder kernels), or None for plain random ones."""
    name, shape = spec.name, spec.shape
    g = chunk_generator(seed, name, -1)
    if re.search(r"norm[^.]*\.weight$", name) and len(shape) == 1:
        return torch.ones(shape)
    if name.endswith("adaln_proj.linear.bias"):
        bias = torch.zeros(3, 6, shape[0] // 18)
        bias[:, 2] = bias[:, 5] = _GATE_BIAS
        bias[0, 1] = _TEXT_VALUE_GAIN - 1.0
        return bias
    if cfg.class_name == "H3VideoVAEDecoder":
        return _video_decoder_tensor(name, shape, g)
    if cfg.class_name == "H3AudioVAEDecoder":
        return _audio_decoder_tensor(name, shape, g)
    return None


def _blur(kernel_shape: tuple[int, ...]) -> torch.Tensor:
    """Binomial smoothing kernel of the given shape (1 or 3 per axis), summing to 1."""
    k = torch.ones(())
    for size in kernel_shape:
        axis = torch.tensor([1.0]) if size == 1 else torch.tensor([1.0, 2.0, 1.0])
        k = k[..., None] * axis
    return k / k.sum()


def _video_decoder_tensor(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Channel mixes times smoothing kernels: white latents become smooth colour fields."""
    if name.endswith(".bias"):
        return torch.zeros(shape)
    c_out, c_in, *kernel = shape
    mix = torch.randn(c_out, c_in, generator=g) / math.sqrt(c_in)
    if name.startswith("conv_in"):
        blur = _blur(tuple(kernel))
        return mix[:, :, None, None, None] * (blur / blur.square().sum().sqrt())
    if name.startswith("conv_out"):
        return (0.4 * mix).reshape(shape)
    return mix[:, :, None, None, None] * _blur(tuple(kernel)) * math.sqrt(c_in / max(c_in, c_out)) * 1.4


def _audio_decoder_tensor(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Random mixes; the loudness bias keeps most oscillators quiet so a few tones stand out."""
    if name == "conv_out.bias":
        return torch.full(shape, -2.0)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    return torch.randn(shape, generator=g) * (2.0 / math.sqrt(_fan_in(shape)))
