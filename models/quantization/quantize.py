"""Weight-only quantization of the H3 DiT with torchao, one Linear at a time as the loader places it.

torchao is optional (`requirements-quant.txt`; its wheel has no runtime
dependencies, so it never pulls a CUDA torch). `int8` runs on CPU and CUDA,
`fp8` and `fp8-compute` (dynamic fp8 activations with fp8 weights, a speed lever:
`models.speed.levers`) need CUDA compute capability 8.9 or newer. The frames differ from
bf16's (not bit-identical): the seed contract holds for unquantized runs only.

`LinearQuantizer` watches the loader's per-tensor events and quantizes each
`nn.Linear` the moment its last tensor is placed, so the bf16 weights held
beside quantized ones are at most one Linear's, never the whole DiT. Modules
the class keeps in float32 (`_keep_in_fp32_modules`) stay unquantized.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from core.errors import PlacementError
from loader.report import TensorPlaced

from ..checkpoint.classes import build_empty, class_name_of, component_class, component_config, fp32_patterns
from .check import FP8_COMPUTE, FP8_KINDS, INSTALL_HINT, cuda_capability, quantization_problem

SCALE_BYTES = {"int8": 5, "fp8": 4, FP8_COMPUTE: 4}
"""Bytes per output row besides the weights: int8 keeps a float32 scale and an int8 zero point, fp8 a scale (fp8
compute's weights are scaled per row too; its activations are scaled as each call runs, not stored)."""
DIT_COMPONENTS = ("transformer", "transformer_ref")
"""The components a quantization applies to."""


def quant_config(kind: str, device: torch.device):
    """torchao's config for `kind`, or PlacementError saying why it cannot run here."""
    try:
        from torchao.quantization import (Float8DynamicActivationFloat8WeightConfig, Float8WeightOnlyConfig,
                                          Int8WeightOnlyConfig, PerRow)
    except ImportError:
        raise PlacementError(f"quantize={kind} needs torchao: {INSTALL_HINT}") from None
    if kind == "int8":
        return Int8WeightOnlyConfig()
    if kind in FP8_KINDS:
        capability = cuda_capability(device.type, device.index)
        problem = quantization_problem(kind, str(device), capability, torchao=True)
        if problem is not None:
            raise PlacementError(f"quantize={problem}")
        if kind == "fp8":
            return Float8WeightOnlyConfig()
        return Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())
    raise PlacementError(f"unknown quantization {kind!r}; known: {', '.join(SCALE_BYTES)}")


def quantizable(module: nn.Module, fp32: tuple[str, ...]) -> dict[str, nn.Linear]:
    """Path -> each Linear of `module` that is not kept in float32 by the class's rule (`fp32` regexes)."""
    return {path: m for path, m in module.named_modules()
            if isinstance(m, nn.Linear) and not any(re.search(p, path) for p in fp32)}


class LinearQuantizer:
    """Quantizes each Linear of `module` right after the loader placed its last tensor (an `on_tensor` sink)."""

    def __init__(self, module: nn.Module, kind: str, device: torch.device, fp32: tuple[str, ...],
                 then: Callable[[TensorPlaced], None] | None = None):
        self._config = quant_config(kind, device)
        self._linears = quantizable(module, fp32)
        self._waiting = {path: {f"{path}.{n}" for n, _ in linear.named_parameters()}
                         for path, linear in self._linears.items()}
        self._owner = {name: path for path, names in self._waiting.items() for name in names}
        self._then = then
        self.quantized: list[str] = []
        """Linear paths in the order they were quantized."""

    def __call__(self, placed: TensorPlaced) -> None:
        path = self._owner.get(placed.name)
        if path is not None:
            waiting = self._waiting[path]
            waiting.discard(placed.name)
            if not waiting:
                self._quantize(path)
        if self._then is not None:
            self._then(placed)

    def _quantize(self, path: str) -> None:
        from torchao.quantization import quantize_

        quantize_(self._linears[path], self._config)
        self.quantized.append(path)

    def finish(self) -> None:
        """PlacementError when a Linear was never completed (the loader skipped one of its tensors)."""
        left = [p for p, names in self._waiting.items() if names]
        if left:
            raise PlacementError(f"{len(left)} Linear(s) of the DiT were not fully placed: {', '.join(left[:3])}")


def quantized_bytes(root: str | os.PathLike, component: str, kind: str | None, dtype_bytes: int = 2) -> int:
    """Bytes the DiT `component` at `root` holds under `kind` (None: unquantized at `dtype_bytes` per element;
    fp32-kept modules at 4), from its config alone: what the forecast needs for a quantized run."""
    config = component_config(Path(root), component)
    module = build_empty(config)
    fp32 = fp32_patterns(component_class(class_name_of(config) or ""))
    linears = quantizable(module, fp32) if kind is not None else {}
    quantized = {f"{p}.weight" for p in linears}
    total = 0
    for name, tensor in module.state_dict(keep_vars=True).items():
        if name in quantized:
            total += tensor.numel() + tensor.shape[0] * SCALE_BYTES[kind]
        elif not tensor.is_floating_point():
            total += tensor.numel() * tensor.element_size()
        else:
            total += tensor.numel() * (4 if any(re.search(p, name) for p in fp32) else dtype_bytes)
    return total


def held_bytes(module: nn.Module) -> int:
    """Bytes `module`'s parameters hold, torchao's tensor subclasses counted by their inner tensors."""
    return sum(_tensor_bytes(p) for p in module.parameters())


def _tensor_bytes(tensor: Any) -> int:
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is None:
        return tensor.numel() * tensor.element_size()
    return sum(_tensor_bytes(getattr(tensor, name)) for name in flatten()[0])
