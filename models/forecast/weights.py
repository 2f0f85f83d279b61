"""What each weight component holds at the run's dtype, from its headers: the text encoder without what the
workflow never reads, fp32 modules kept fp32, a quantized or single-file DiT, the host's page-locked blocks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, Mapping

from loader import packed_bytes
from loader.roots import ModelRoots
from loader.safetensors_file import read_shard_header
from machine.offload import OffloadSettings

from ..request.params import TEXT_ENCODER_LAYER
from ..run.residency import pins_host_copy
from ..run.workflows import workflow_components


def weight_bytes(root: str | Path, dtype_bytes: int = 2, *, workflow: str = "t2va", quantize: str | None = None,
                 vae_dtype: str = "bf16", audio: bool = True, transformer: str | None = None) -> dict[str, int]:
    """Each weight component `workflow` reads, its bytes as the run holds them, from the headers: the text
    encoder without what the workflow never reads, the DiT quantized (`models.quantization.quantize.quantized_bytes`,
    from its config) when `quantize` is set, the video VAE at fp32 when `vae_dtype` says so; `transformer`,
    a single-file DiT, is counted from its own header."""
    from ..quantization.quantize import DIT_COMPONENTS, quantized_bytes

    root = Path(root)
    sizes = {}
    for name in workflow_components(workflow, audio):
        if name in DIT_COMPONENTS and quantize is not None:
            sizes[name] = quantized_bytes(root, name, quantize, dtype_bytes)
        else:
            element = 4 if name == "vae" and vae_dtype == "fp32" else dtype_bytes
            sizes[name] = component_bytes(weights_of(root, name, transformer), keep_fp32_of(root, name), element,
                                          workflow)
    return sizes


def weights_of(root: Path, name: str, transformer: str | None) -> Path:
    """Where component `name`'s weights are: its folder, or for the DiT the single file given instead."""
    return Path(transformer) if name == "transformer" and transformer is not None else root / name


def keep_fp32_of(root: Path, name: str) -> tuple[str, ...]:
    """The component class's float32 modules (diffusers' dtype rule), from the index's class name."""
    import importlib

    from ..checkpoint.classes import keep_fp32_modules

    library, class_name = json.loads((root / "modular_model_index.json").read_text())[name][:2]
    return keep_fp32_modules(getattr(importlib.import_module(library), class_name))


def unread_by(name: str, workflow: str) -> bool:
    """Text-encoder tensors `workflow` never reads: the LM head and the decoder layers after layer 50 (layers
    0..50 stay, so `hidden_states[50]` remains the pre-norm state), and for t2va the vision tower (the
    loader's rule, `models.checkpoint.components.text_encoder_pruning`)."""
    if name.startswith("lm_head.") or (workflow == "t2va" and name.startswith("model.visual.")):
        return True
    prefix = "model.language_model.layers."
    return name.startswith(prefix) and int(name[len(prefix):].split(".", 1)[0]) > TEXT_ENCODER_LAYER


def component_bytes(folder: Path, keep_fp32: tuple[str, ...], dtype_bytes: int, workflow: str = "t2va",
                    roots: ModelRoots | None = None) -> int:
    """Bytes of a component's tensors at the run's dtype (`tensor_bytes`)."""
    return sum(tensor_bytes(folder, keep_fp32, dtype_bytes, workflow, roots))


def pinned_component_bytes(folder: Path, keep_fp32: tuple[str, ...], dtype_bytes: int,
                           roots: ModelRoots | None = None) -> int:
    """Host bytes of a component the loader places page-locked (`pin_host`): its tensors packed, in load
    order, into power-of-two blocks (`loader.packed_bytes`)."""
    return packed_bytes(tensor_bytes(folder, keep_fp32, dtype_bytes, roots=roots))


def tensor_bytes(folder: Path, keep_fp32: tuple[str, ...], dtype_bytes: int, workflow: str = "t2va",
                 roots: ModelRoots | None = None) -> Iterator[int]:
    """Each tensor's bytes at the run's dtype, in the loader's order (shards by name, tensors by offset): fp32
    where diffusers keeps fp32 (a dotted part of the name in `_keep_in_fp32_modules`), else `dtype_bytes`;
    tensors `workflow` never reads are left out. `roots`: where the shards may lie (default: the folder).
    `folder` may be a single-file DiT in the reference layout, its names read as diffusers names them, or a
    GGUF one, its quantized tensors counted packed (`models.checkpoint.gguf.held_bytes`)."""
    from loader.gguf_header import is_gguf

    from ..checkpoint.single_file import diffusers_name

    if is_gguf(folder):
        from ..checkpoint.gguf import held_bytes

        yield from held_bytes(folder, keep_fp32, dtype_bytes)
        return
    single = folder.is_file()
    for path in [folder] if single else sorted(folder.glob("*.safetensors")):
        shard, problems = read_shard_header(path, roots)
        if shard is None:
            raise ValueError(f"{path}: " + "; ".join(problems))
        for t in sorted(shard.tensors, key=lambda t: t.offset):
            name = diffusers_name(t.name) if single else t.name
            if folder.name == "text_encoder" and unread_by(name, workflow):
                continue
            if not t.dtype.startswith(("F", "BF")):
                yield t.nbytes
            elif any(part in keep_fp32 for part in name.split(".")):
                yield t.numel * 4
            else:
                yield t.numel * dtype_bytes


def host_bytes(root: Path, sizes: Mapping[str, int], placements, settings: OffloadSettings, cuda: bool,
                bf16_dit: bool, dtype_bytes: int, transformer: str | None = None) -> dict[str, int]:
    """Each component's bytes as the host holds them: one the loader places page-locked
    (`models.run.residency.pins_host_copy`) takes its power-of-two blocks (`pinned_component_bytes`). A quantized
    DiT is not pinned by the loader; group offload then pins torchao's tensors, whose size is not modelled."""
    from ..quantization.quantize import DIT_COMPONENTS

    host = dict(sizes)
    for name in DIT_COMPONENTS:
        if name in placements and pins_host_copy(placements[name], "cuda" if cuda else "cpu", settings,
                                                 quantized=not bf16_dit):
            host[name] = pinned_component_bytes(weights_of(root, name, transformer), keep_fp32_of(root, name),
                                                dtype_bytes)
    return host
