"""Synthetic MiniMax H3 checkpoints: random weights of the real architecture, in the release's on-disk layout.

`synth_h3` writes a root with `modular_model_index.json` (`_class_name`
`MiniMaxH3ModularPipeline`) and the release's folders: `text_encoder/` in the
transformers layout (`model-0000i-of-0000n.safetensors` +
`model.safetensors.index.json`), `transformer/` (and `transformer_ref/` where the
profile has it), `vae/` and `audio_vae/` in the diffusers layout
(`diffusion_pytorch_model-...`), `tokenizer/`, `processor/`, `scheduler/`,
`audio_scheduler/`. Configs are the classes' own (`to_json_string`), shapes come
from each class built empty, and the precision is the release's: the DiT's
`_keep_in_fp32_modules` and both VAEs in float32, the rest in the requested dtype.

Values are random (the video is noise): uniform with std `1/sqrt(fan_in)`,
norm weights of one, buffers the constructor computes. They are generated in
chunks from a generator seeded by (seed, tensor, chunk) and streamed to disk, a few
shard files at once, so a real-size DiT never needs to be in memory.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from safetensors import safe_open

from core.diskspace import free_bytes, is_disk_full, require_space
from core.errors import DiskFullError
from loader.safetensors_file import TensorSpec, header_bytes, plan_shards, write_safetensors

from ..checkpoint.classes import build_empty, fp32_patterns
from .profiles import Profile, ProfileError

PIPELINE_CLASS = "MiniMaxH3ModularPipeline"
"""`_class_name` of the root's `modular_model_index.json`."""

RELEASE_REPO = "MiniMaxAI/MiniMax-H3"
"""The release's repository id, which its index names; diffusers loads local copies of it from the folder itself."""

WEIGHT_CLASSES = {
    "text_encoder": ("transformers", "Qwen3VLForConditionalGeneration"),
    "transformer": ("diffusers", "MiniMaxH3Transformer3DModel"),
    "transformer_ref": ("diffusers", "MiniMaxH3Transformer3DModel"),
    "vae": ("diffusers", "AutoencoderKLMiniMaxH3"),
    "audio_vae": ("diffusers", "AutoencoderKLMiniMaxH3Audio"),
}
"""Weight folders and their (library, class)."""

AUX_CLASSES = {
    "tokenizer": ("transformers", "Qwen2Tokenizer"),
    "processor": ("transformers", "Qwen3VLProcessor"),
    "scheduler": ("diffusers", "MiniMaxH3Scheduler"),
    "audio_scheduler": ("diffusers", "MiniMaxH3Scheduler"),
}
"""Non-weight folders and their (library, class)."""

SCHEDULER_SHIFTS = {"scheduler": 12.0, "audio_scheduler": 3.0}
"""H3's two flow schedules: video shift 12, audio shift 3."""

SHARD_WRITERS = 4
"""Shard files written at once (each from its own thread; the random values come from the shared pool)."""

_AUX_BYTES = 4 * 2**20
"""Room asked for the configs, tokenizer and processor files on top of the tensors."""

CHUNK_ELEMENTS = 1 << 24
"""Elements generated per chunk of a large random tensor (64 MiB in fp32)."""


def chunk_generator(seed: int, name: str, chunk: int) -> torch.Generator:
    """The generator of one chunk of one tensor: the bytes depend on (seed, name, chunk) only, not on threads."""
    digest = hashlib.sha256(f"{seed}:{name}:{chunk}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def random_chunks(pool: ThreadPoolExecutor, spec: TensorSpec, seed: int, bound: float,
                  ahead: int) -> Iterator[torch.Tensor]:
    """Uniform values in [-bound, bound] as chunks in `spec.dtype`, generated `ahead` chunks ahead on `pool`
    (one more than its workers keeps every worker busy)."""
    starts = list(range(0, spec.numel, CHUNK_ELEMENTS))

    def make(i: int) -> torch.Tensor:
        n = min(CHUNK_ELEMENTS, spec.numel - starts[i])
        return torch.empty(n).uniform_(-bound, bound, generator=chunk_generator(seed, spec.name, i)).to(spec.dtype)

    futures = [pool.submit(make, i) for i in range(min(ahead, len(starts)))]
    for i in range(len(starts)):
        chunk = futures[i].result()
        futures[i] = None
        if i + ahead < len(starts):
            futures.append(pool.submit(make, i + ahead))
        yield chunk



@dataclass
class ComponentPlan:
    """What one weight folder holds (or would hold)."""

    name: str
    """Folder name."""
    class_name: str | None
    """The class its config names (None for the pruned layout, which no library defines)."""
    tensors: int
    """Tensor count."""
    parameters: int
    """Sum of numel."""
    bytes: int
    """Tensor bytes as stored."""
    shards: int
    """Number of safetensors files."""
    dtypes: dict[str, int] = field(default_factory=dict)
    """Bytes per stored dtype."""


@dataclass
class SynthReport:
    """The result of a synth run (or a dry run)."""

    path: str
    """Root folder."""
    profile: str
    """Profile name."""
    dtype: str
    """Dtype of the tensors not pinned to float32."""
    seed: int
    """Seed of every value."""
    components: list[ComponentPlan] = field(default_factory=list)
    """One entry per weight folder."""
    aux: list[str] = field(default_factory=list)
    """Non-weight folders written (or planned)."""
    written: bool = False
    """False for a dry run."""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Weights:
    """One weight folder to write."""

    name: str
    class_name: str | None
    config_text: str
    stem: str
    shards: list[list[TensorSpec]]
    buffers: dict[str, torch.Tensor]
    """Persistent buffers the constructor computed (written as they are, not random)."""


def _tokenizer(profile: Profile):
    from ..checkpoint.text_aux import build_tokenizer

    return build_tokenizer(profile.bpe_merges)


def _class_config(profile: Profile, name: str, dtype: torch.dtype, tokenizer) -> dict:
    """The config dict the class is built from."""
    if name == "text_encoder":
        from transformers import Qwen3VLConfig

        from ..checkpoint.text_aux import special_token_ids

        text = {"vocab_size": len(tokenizer)} | profile.text_config
        config = Qwen3VLConfig(text_config=text, vision_config=profile.vision_config, tie_word_embeddings=False,
                               **special_token_ids(tokenizer))
        config.architectures = ["Qwen3VLForConditionalGeneration"]
        config.dtype = dtype
        return config.to_dict()
    args = {"transformer": profile.transformer, "transformer_ref": profile.transformer, "vae": profile.vae,
            "audio_vae": profile.audio_vae}[name]
    return {"_class_name": WEIGHT_CLASSES[name][1], **args}


def _stored_dtype(name: str, tensor_name: str, dtype: torch.dtype, fp32: Sequence[re.Pattern]) -> torch.dtype:
    if name in ("vae", "audio_vae") or any(p.search(tensor_name) for p in fp32):
        return torch.float32
    return dtype


def _plan_weights(profile: Profile, name: str, dtype: torch.dtype, shard_bytes: int, tokenizer) -> _Weights:
    module = build_empty(_class_config(profile, name, dtype, tokenizer))
    fp32 = [re.compile(p) for p in fp32_patterns(type(module))] if name != "text_encoder" else []
    state = module.state_dict()
    persistent = {n for n, _ in module.named_buffers() if n in state}
    config_text = module.config.to_json_string() if name == "text_encoder" else module.to_json_string()
    if profile.load_only:
        specs = _pruned_specs(state, profile.adaln_rank, dtype)
        config = json.loads(config_text)
        config.pop("_class_name")
        config_text = json.dumps({"_drainboard_layout": profile.name, "adaln_rank": profile.adaln_rank, **config},
                                 indent=2, sort_keys=True) + "\n"
        class_name = None
    else:
        specs = [TensorSpec(n, tuple(t.shape), t.dtype if n in persistent else _stored_dtype(name, n, dtype, fp32))
                 for n, t in state.items()]
        class_name = WEIGHT_CLASSES[name][1]
    stem = "model" if name == "text_encoder" else "diffusion_pytorch_model"
    return _Weights(name, class_name, config_text, stem, plan_shards(specs, shard_bytes),
                    {n: state[n].detach().clone() for n in persistent})


_PRUNED_RENAMES = ((".attn.to_out.0.", ".attn.to_out."), (".ff.net.0.proj.", ".ff.fc_in."), (".ff.net.2.", ".ff.fc_out."))
"""diffusers' names -> FastVideo's converted ones, which the seed's pruned checkpoint uses."""


def _pruned_specs(state: dict[str, torch.Tensor], rank: int, dtype: torch.dtype) -> list[TensorSpec]:
    """The rank-r pruned DiT: FastVideo's names, every AdaLN projection reading a shared `adaln_basis` (r x time_embed)."""
    specs = []
    for name, tensor in state.items():
        for old, new in _PRUNED_RENAMES:
            name = name.replace(old, new)
        shape = tuple(tensor.shape)
        if name.endswith(("adaln_proj.linear.weight", "norm_out.linear.weight")):
            time_embed_dim, shape = shape[1], (shape[0], rank)
        specs.append(TensorSpec(name, shape, dtype))
        if name == "time_embedder.linear_2.bias":
            specs.append(TensorSpec("adaln_basis.weight", (rank, tensor.shape[0]), dtype))
    return specs


def _report_component(w: _Weights) -> ComponentPlan:
    specs = [s for shard in w.shards for s in shard]
    dtypes: dict[str, int] = {}
    for s in specs:
        key = str(s.dtype).removeprefix("torch.")
        dtypes[key] = dtypes.get(key, 0) + s.nbytes
    return ComponentPlan(w.name, w.class_name, len(specs), sum(s.numel for s in specs), sum(s.nbytes for s in specs),
                         len(w.shards), dict(sorted(dtypes.items())))


def synth_h3(
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
    schedulers: Mapping[str, Mapping[str, Any]] | None = None,
) -> SynthReport:
    """Write (or, with `dry_run`, only plan) the checkpoint of `profile` into `out`.

    `schedulers` ("scheduler" / "audio_scheduler" -> keys) is written over the release's scheduler configs:
    a distilled few-step checkpoint's own `shift` and `num_inference_steps`, with the same classes.

    `components` limits the folders written (e.g. only `transformer`); the
    index still lists only what is on disk. Refuses up front (DiskFullError)
    when the disk cannot hold it; hit by a full disk mid-write, removes every
    file this run wrote and says which one filled it.
    """
    root = Path(out)
    chosen = _chosen(profile, components)
    tokenizer = _tokenizer(profile) if {"text_encoder", "tokenizer", "processor"} & set(chosen) else None
    weights = [_plan_weights(profile, n, dtype, shard_bytes or profile.shard_bytes, tokenizer)
               for n in chosen if n in WEIGHT_CLASSES]
    aux = [n for n in chosen if n in AUX_CLASSES]
    report = SynthReport(str(root), profile.name, str(dtype).removeprefix("torch."), seed,
                         [_report_component(w) for w in weights], aux, written=not dry_run)
    if dry_run:
        return report
    total = sum(c.bytes for c in report.components)
    headers = sum(len(header_bytes(shard)) for w in weights for shard in w.shards)
    replaced = sum(p.stat().st_size for w in weights for p in _shard_paths(root, w) if p.is_file())
    require_space(root, total + headers + _AUX_BYTES - replaced, f"the {profile.name} checkpoint")
    done = 0
    counting = threading.Lock()

    def count(n: int) -> None:
        nonlocal done
        with counting:
            done += n

    def publish() -> None:
        """Progress goes out on the calling thread only: a Streamlit progress bar refuses other threads."""
        if on_bytes is not None:
            with counting:
                now = done
            on_bytes(now, total)

    root.mkdir(parents=True, exist_ok=True)
    touched: list[Path] = []
    """Files this run opened for writing, in order; the last is the one being written."""
    try:
        _write(root, profile, weights, aux, tokenizer, seed, workers, count, publish, touched, schedulers or {})
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


def _chosen(profile: Profile, components: Sequence[str] | None) -> list[str]:
    if components is None:
        return list(profile.components)
    known = profile.components
    unknown = sorted(set(components) - set(known))
    if unknown:
        raise ProfileError(f"unknown component(s) {', '.join(unknown)} for profile {profile.name}; "
                           f"known: {', '.join(known)}")
    return [n for n in known if n in components]


def _shard_name(stem: str, i: int, n: int) -> str:
    return f"{stem}-{i:05d}-of-{n:05d}.safetensors"


def _shard_paths(root: Path, w: _Weights) -> Iterator[Path]:
    for i in range(1, len(w.shards) + 1):
        yield root / w.name / _shard_name(w.stem, i, len(w.shards))


def _write(
    root: Path, profile: Profile, weights: list[_Weights], aux: list[str], tokenizer, seed: int,
    workers: int | None, count: Callable[[int], None], publish: Callable[[], None], touched: list[Path],
    schedulers: Mapping[str, Mapping[str, Any]],
) -> None:
    """Every folder, then `modular_model_index.json`.

    Indexes are written after what they list and removed before it is replaced, so an
    index on disk always means complete.
    """
    index_path = root / "modular_model_index.json"
    index_path.unlink(missing_ok=True)
    index: dict = {"_blocks_class_name": "MiniMaxH3Blocks", "_class_name": PIPELINE_CLASS,
                   "_drainboard_profile": profile.name, "_drainboard_seed": seed}
    if profile.canvas is not None:
        index["canvas_short_edge"], index["canvas_max_pixels"] = profile.canvas
        # A reference image is resized to this short edge before the VAE encodes it (2048 by default).
        index["reference_image_short_edge"] = profile.canvas[0]
    threads = workers or min(16, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for w in weights:
            folder = root / w.name
            folder.mkdir(exist_ok=True)
            weight_index = folder / f"{w.stem}.safetensors.index.json"
            weight_index.unlink(missing_ok=True)
            touched.append(folder / "config.json")
            touched[-1].write_text(w.config_text)
            weight_map = {}

            def chunks(spec: TensorSpec, w: _Weights = w) -> Iterator[torch.Tensor]:
                if spec.name in w.buffers:
                    return iter([w.buffers[spec.name].to(spec.dtype).reshape(-1)])
                constant = _constant(spec)
                if constant is not None:
                    return iter([torch.full((spec.numel,), constant, dtype=spec.dtype)])
                return random_chunks(pool, spec, seed, _bound(spec), threads + 1)

            def write_shard(path: Path, shard: list[TensorSpec]) -> None:
                write_safetensors(path, shard, chunks, on_bytes=count)
                _check_readable(path, shard)

            # Several shard files at once: one writing stream is slower than the generator threads
            # (0.81 GB/s into the H200 host's tmpfs with 16 of them).
            with ThreadPoolExecutor(max_workers=SHARD_WRITERS) as writers:
                futures = []
                for path, shard in zip(_shard_paths(root, w), w.shards):
                    touched.append(path)
                    futures.append(writers.submit(write_shard, path, shard))
                    weight_map.update({spec.name: path.name for spec in shard})
                pending = set(futures)
                while pending:
                    finished, pending = wait(pending, timeout=0.25)
                    for future in finished:
                        future.result()
                    publish()
            size = sum(s.nbytes for shard in w.shards for s in shard)
            touched.append(weight_index)
            weight_index.write_text(json.dumps({"metadata": {"total_size": size}, "weight_map": weight_map}, indent=2) + "\n")
            index[w.name] = _index_entry(w.name, *(WEIGHT_CLASSES[w.name] if w.class_name else (None, None)))
    for name in aux:
        folder = root / name
        before = set(folder.rglob("*")) if folder.exists() else set()
        try:
            _write_aux(folder, name, tokenizer, schedulers.get(name, {}))
        finally:
            touched.extend(sorted(p for p in set(folder.rglob("*")) - before if p.is_file()))
        index[name] = _index_entry(name, *AUX_CLASSES[name])
    touched.append(index_path)
    index_path.write_text(json.dumps(dict(sorted(index.items())), indent=2) + "\n")


def _index_entry(name: str, library: str | None, class_name: str | None) -> list:
    """One `modular_model_index.json` entry, as diffusers' `save_pretrained` writes it."""
    spec = {"pretrained_model_name_or_path": RELEASE_REPO, "revision": None, "subfolder": name,
            "type_hint": [library, class_name], "variant": None}
    return [library, class_name, spec]


def _write_aux(folder: Path, name: str, tokenizer, overrides: Mapping[str, Any]) -> None:
    if name == "tokenizer":
        tokenizer.save_pretrained(str(folder))
    elif name == "processor":
        from ..checkpoint.text_aux import save_processor

        save_processor(folder, tokenizer)
    else:
        from diffusers import MiniMaxH3Scheduler

        folder.mkdir(parents=True, exist_ok=True)
        config = {**json.loads(MiniMaxH3Scheduler(shift=SCHEDULER_SHIFTS[name]).to_json_string()), **overrides}
        (folder / "scheduler_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _check_readable(path: Path, shard: list[TensorSpec]) -> None:
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
    expected = {s.name for s in shard}
    if keys != expected:
        raise RuntimeError(f"{path}: safe_open lists {len(keys)} tensors, expected {len(expected)}")


_NORM_WEIGHT = re.compile(r"(?:norm|layernorm)[^.]*\.weight$")


def _constant(spec: TensorSpec) -> float | None:
    """Values the constructor sets to a constant (norm scales; Snake activations), or None for random ones."""
    if len(spec.shape) == 1 and _NORM_WEIGHT.search(spec.name):
        return 1.0
    if spec.name.endswith((".alpha", ".beta")):
        return 1.0 if len(spec.shape) == 3 else 0.0
    return None


def _bound(spec: TensorSpec) -> float:
    """Half-width of the uniform values: std `1/sqrt(fan_in)` (0.02 for biases)."""
    if spec.name.endswith(".bias"):
        std = 0.02
    else:
        fan_in = math.prod(spec.shape[1:]) if len(spec.shape) > 1 else spec.shape[0]
        std = 1.0 / math.sqrt(max(fan_in, 1))
    return std * math.sqrt(3.0)
