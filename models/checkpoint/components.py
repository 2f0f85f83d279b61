"""Build each MiniMax H3 component empty from its config and have Drainboard's loader fill it.

The classes are diffusers' (`MiniMaxH3Transformer3DModel`, `AutoencoderKLMiniMaxH3`,
`AutoencoderKLMiniMaxH3Audio`) and transformers' (`Qwen3VLForConditionalGeneration`).
Nothing of the model is re-implemented here; the empty module is built by
`models.checkpoint.classes` (its construction and dtype rule), and this module decides what
the loader reads into it:

- **Reading only what the workflow uses.** MiniMax H3 conditions on
  `hidden_states[50]` of the text encoder and never calls `lm_head`; `t2va`
  never runs the vision tower. Those modules are removed from the empty text
  encoder (decoder layers past 50 are cut, so the stack keeps 51 layers and
  `hidden_states[50]` stays the pre-norm state) and their tensors are excluded
  from the load: never read, counted in the report.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from loader import LoadOptions, load_checkpoint
from loader.placement import get_placement
from loader.dtypes import parse_dtype
from loader.gguf_header import is_gguf
from core.echo import NAME_LIMIT, echo
from core.errors import CheckpointError, PlacementError
from machine.device import DeviceInfo
from machine.memory import MemoryProbe
from loader.model_registry import get_model_builder, register_model_builder
from loader.report import LoadReport, TensorPlaced

from .classes import (CLASS_LIBRARIES, build_empty, class_name_of, component_class, component_config, fp32_patterns,
                      read_config)
from ..synth.profiles import HIDDEN_STATE_LAYER
from ..run.workflows import WORKFLOWS

def text_encoder_pruning(module: nn.Module, workflow: str) -> list[str]:
    """Module paths of a Qwen3-VL text encoder that `workflow` never runs.

    The decoder stack keeps layers 0..50: the output collector replaces the last hidden
    state with the normed one, so a stack of exactly 50 layers would turn `hidden_states[50]` post-norm.
    """
    if workflow not in WORKFLOWS:
        raise PlacementError(f"unknown workflow {workflow!r}; known: {', '.join(WORKFLOWS)}")
    layers = module.model.language_model.layers
    keep = HIDDEN_STATE_LAYER + 1
    paths = ["lm_head"] + [f"model.language_model.layers.{i}" for i in range(keep, len(layers))]
    if workflow == "t2va":
        paths.append("model.visual")
    return paths


def prune(module: nn.Module, paths: list[str]) -> None:
    """Remove the submodules at `paths`; trailing entries of a ModuleList are cut, others become `NotLoaded`."""
    for path in paths:
        owner_path, _, leaf = path.rpartition(".")
        owner = module.get_submodule(owner_path) if owner_path else module
        if isinstance(owner, nn.ModuleList):
            del owner[int(leaf):]
        elif leaf in dict(owner.named_children()):
            setattr(owner, leaf, NotLoaded(path))


class NotLoaded(nn.Module):
    """Stands where a submodule was left unread, or a released component was; calling it says so instead of
    computing garbage."""

    def __init__(self, path: str, why: str = "this workflow does not use it"):
        super().__init__()
        self.path = path
        self.why = why

    def forward(self, *args, **kwargs):
        raise RuntimeError(f"{self.path} was not loaded: {self.why}")


def _excluder(paths: list[str]) -> Callable[[str], bool]:
    prefixes = tuple(p + "." for p in paths)
    return lambda name: name.startswith(prefixes)


def load_component(
    root: str | os.PathLike,
    name: str,
    *,
    mode: str = "stream",
    device: str | torch.device = "cpu",
    device_info: DeviceInfo | None = None,
    dtype: str | torch.dtype | None = None,
    workflow: str = "t2va",
    on_tensor: Callable[[TensorPlaced], None] | None = None,
    probe: MemoryProbe | None = None,
    roots: list[str | os.PathLike] | None = None,
    quantize: str | None = None,
    pin_host: bool = False,
    single_file: str | os.PathLike | None = None,
    qkv_layout: str = "stacked",
    adjust: dict[str, Callable[[torch.Tensor], None]] | None = None,
) -> tuple[nn.Module, LoadReport]:
    """Component `name` of the MiniMax H3 checkpoint at `root`, built empty and filled by the loader.

    Returns the module in eval mode on `device` and the loader's report (for the
    text encoder, `excluded` / `excluded_bytes` say what was left unread). `device_info` is a probe of
    `device` already made (the job's), which the loader then does not repeat.
    `quantize` (a DiT only) quantizes each Linear as its tensors are placed (`models.quantization.quantize`).
    `pin_host` (a CPU `device`) places the weights in page-locked blocks, for group offload to copy from.
    `single_file` (a DiT only): the weights come from that one file in the reference layout
    (`models.checkpoint.single_file`, its fused qkv ordered as `qkv_layout` says), built from `root`'s config; a `.gguf`
    file is loaded quantized by diffusers' GGUF path (`models.checkpoint.gguf`), which takes none of the other options.
    `adjust` goes to the loader: in-place changes made as each named weight is placed, before it is quantized
    (how `models.lora.merge` merges LoRAs).
    Raises CheckpointError / PlacementError naming the folder and tensor.
    """
    folder = Path(root) / name
    # A DiT from a single file may use diffusers' defaults where the folder has no config (submit checked the fit).
    config = read_config(folder) if single_file is None else component_config(Path(root), name)
    if single_file is not None and is_gguf(Path(single_file)):
        from .gguf import load_gguf_dit

        return load_gguf_dit(config, Path(single_file), device=device,
                             dtype=parse_dtype(dtype) or torch.bfloat16, qkv_layout=qkv_layout,
                             roots=roots if roots is not None else [root, Path(single_file).parent])
    target_dtype = parse_dtype(dtype)
    cls = component_class(class_name_of(config) or "")
    module = build_empty(config, target_dtype)
    exclude = None
    if class_name_of(config) == "Qwen3VLForConditionalGeneration":
        paths = text_encoder_pruning(module, workflow)
        prune(module, paths)
        exclude = _excluder(paths)
    overrides = {p: torch.float32 for p in fp32_patterns(cls)} if target_dtype is not None else None
    quantizer = None
    if quantize is not None:
        from ..quantization.quantize import LinearQuantizer

        quantizer = on_tensor = LinearQuantizer(module, quantize, torch.device(device), fp32_patterns(cls), on_tensor)
        if mode == "stream":
            # `stream` reserves one CUDA block the size of the bf16 weights and carves them from it. Quantized,
            # half the block falls free as each Linear is replaced, later allocations land in that half, and
            # the block can never be returned: on one H200 an fp8 DiT of 30.9 GiB kept 61.8 GiB reserved
            # through decode, after sequential residency had released it.
            mode = get_placement("stream", reserve=False)
    source, rules = (root, {"component": name}) if single_file is None else (
        single_file, _reference_rules(config, qkv_layout))
    exclude = rules.pop("exclude", exclude)
    options = LoadOptions(
        mode=mode, device=device, device_info=device_info, dtype=target_dtype, dtype_overrides=overrides,
        exclude=exclude, roots=roots if roots is not None else [root, *([] if single_file is None else [Path(single_file).parent])],
        pin_host=pin_host, adjust=adjust, **rules,
    )
    module, report = load_checkpoint(source, options, module=module, on_tensor=on_tensor, probe=probe)
    if quantizer is not None:
        quantizer.finish()
    _place_computed_buffers(module, torch.device(report.device))
    left = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if left:
        raise PlacementError(f"{folder}: {len(left)} tensor(s) still empty after the load: {', '.join(left[:5])}")
    return module, report


def _reference_rules(config: dict, qkv_layout: str) -> dict:
    """`load_checkpoint`'s rename, splits, merges and exclude for a reference-layout DiT of `config`."""
    from .single_file import reference_layout

    layout = reference_layout(config, qkv_layout)
    return {"rename": layout.rename, "splits": layout.splits, "merges": layout.merges, "exclude": layout.exclude}


def non_persistent_buffers(module: nn.Module) -> list[str]:
    """Names of the buffers `module` keeps out of its state dict (never in a checkpoint: the constructor computes them)."""
    persistent = set(module.state_dict(keep_vars=True))
    return [name for name, _ in module.named_buffers(remove_duplicate=False) if name not in persistent]


def _place_computed_buffers(module: nn.Module, device: torch.device) -> None:
    """Move the constructor's non-persistent buffers next to the loaded weights (re-registered, still non-persistent)."""
    for name in non_persistent_buffers(module):
        owner_path, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_path) if owner_path else module
        buffer = owner.get_buffer(leaf)
        if buffer.device != device:
            owner.register_buffer(leaf, buffer.to(device), persistent=False)


AUX_COMPONENTS = ("tokenizer", "processor", "scheduler", "audio_scheduler")
"""The non-weight folders of a MiniMax H3 root."""


def load_aux(root: str | os.PathLike, name: str, shift: float | None = None):
    """Non-weight component `name` (tokenizer, processor, scheduler, audio_scheduler) built from its folder; a
    scheduler with `shift` given is built with that sigma shift in place of its config's.

    Everything is read from local files; nothing contacts a hub. The processor
    has its video part without torchvision (see `models.checkpoint.text_aux`). Raises CheckpointError naming the folder.
    """
    from . import text_aux

    folder = Path(root) / name
    if name not in AUX_COMPONENTS:
        raise CheckpointError(f"{folder}: unknown non-weight component {name!r}; known: {', '.join(AUX_COMPONENTS)}")
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such folder (the checkpoint has no {name})")
    try:
        if name == "tokenizer":
            return text_aux.load_tokenizer(folder)
        if name == "processor":
            return text_aux.load_processor(folder)
        from diffusers import MiniMaxH3Scheduler

        config = read_config(folder, "scheduler_config.json")
        if config.get("_class_name") != "MiniMaxH3Scheduler":
            raise CheckpointError(
                f"{folder / 'scheduler_config.json'}: _class_name is {echo(config.get('_class_name'), NAME_LIMIT)}, expected 'MiniMaxH3Scheduler'"
            )
        return MiniMaxH3Scheduler.from_config(config, **({} if shift is None else {"shift": shift}))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{folder}: cannot build the {name}: {exc}") from exc


def register_builders() -> None:
    """Register every class with the loader's model registry (once), so a plain `load_checkpoint`
    of a MiniMax H3 folder builds diffusers' / transformers' class the same way."""
    for class_name in CLASS_LIBRARIES:
        if get_model_builder(class_name) is None:
            register_model_builder(class_name, build_empty, keep_fp32=fp32_patterns(component_class(class_name)))
