"""LoRAs merged into a DiT while the loader streams it: each targeted weight gets its deltas as it is placed.

The factors are diffusers' (`MiniMaxH3LoraLoaderMixin.lora_state_dict`, which
converts every layout it reads and honours an `alpha` in the file's
`__metadata__`); the scale of each module is PEFT's, read from adapters that
diffusers' `load_lora_adapter` injects into a meta-device copy of the DiT (no
weight, no factor there: only the `alpha / rank` PEFT would use, and the file's
rank and alpha patterns applied as PEFT applies them). Nothing of the loaded DiT
is wrapped: no adapter module, no second copy of any weight.

The arithmetic is diffusers' `fuse_lora` on the CPU, exactly: the factors are
rounded to the weight's dtype (PEFT holds them in the base layer's dtype),
`(B @ A)` is computed in float32 and scaled, rounded once to the weight's dtype
and added to it in that dtype; stacked LoRAs are added in the order given. On
CUDA, PEFT multiplies bf16 factors in bf16; Drainboard keeps the float32
product there too, so a CUDA run is not bit-equal to diffusers' CUDA fuse.

`lora_state_dict` reads the whole file: the converted factors of every LoRA
merged into a partition are held while it loads, and each target's factors are
dropped as soon as its weight is merged (the loader consumes the adjustments), so
what is held falls as the load goes. A quantized DiT is merged before each Linear
is quantized (the loader adjusts a tensor before anyone sees it placed).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn

from core.echo import echo_name

from .lora_inputs import MERGE_BLOCK_ELEMENTS, LoraError, LoraInput, check_factors, file_sha256


@dataclass
class LoraMerge:
    """What merging a partition's LoRAs did and held."""

    loras: list[dict[str, Any]] = field(default_factory=list)
    """Per LoRA, in merge order: file, sha256, scale, partition, targets, ranks, factor_bytes."""
    factor_bytes: int = 0
    """Bytes of every converted factor held when the load started."""
    read_seconds: float = 0.0
    """Reading, hashing and converting the files (before the load's first tensor)."""
    merge_seconds: float = 0.0
    """Spent adding deltas to weights, inside the load."""

    def to_dict(self) -> dict[str, Any]:
        return {"loras": self.loras, "factor_bytes": self.factor_bytes, "read_seconds": self.read_seconds,
                "merge_seconds": self.merge_seconds}


Factor = tuple[torch.Tensor, torch.Tensor, float]
"""(lora_A, lora_B, scale) of one LoRA for one weight."""


def merge_adjustments(loras: Iterable[LoraInput], partition: str, config: dict, roots: Iterable[str | os.PathLike]
                      ) -> tuple[dict[str, Callable[[torch.Tensor], None]], LoraMerge]:
    """The loader's `adjust` mapping that merges `loras` into the `partition` DiT of `config` as its weights
    are placed, and the record of it. LoraError / CheckpointError name the file."""
    report = LoraMerge()
    start = time.perf_counter()
    roots = list(roots)
    shell = _meta_shell(config)
    shapes = {n: tuple(p.shape) for n, p in shell.named_parameters()}  # before any adapter renames them
    per_weight: dict[str, list[Factor]] = {}
    for i, lora in enumerate(loras):
        factors, scales, digest = _read(lora, roots, shell, f"drainboard_{i}")
        shown = echo_name(lora.file)
        targets, ranks = check_factors(factors, shapes, shown, partition)
        nbytes = 0
        for target in targets:
            module_path = target.removesuffix(".weight")
            a, b = factors[f"{module_path}.lora_A.weight"], factors[f"{module_path}.lora_B.weight"]
            nbytes += a.nbytes + b.nbytes
            per_weight.setdefault(target, []).append((a, b, scales[module_path] * lora.scale))
        report.factor_bytes += nbytes
        report.loras.append({"file": lora.file, "sha256": digest, "scale": lora.scale, "partition": partition,
                             "targets": len(targets), "ranks": sorted(set(ranks)), "factor_bytes": nbytes})
        del factors
    report.read_seconds = time.perf_counter() - start
    return {name: _merger(factors, report) for name, factors in per_weight.items()}, report


def _merger(factors: list[Factor], report: LoraMerge) -> Callable[[torch.Tensor], None]:
    def merge(weight: torch.Tensor) -> None:
        start = time.perf_counter()
        for a, b, scale in factors:
            merge_delta(weight, a, b, scale)
        factors.clear()  # this weight's factors are freed now, not at the end of the load
        report.merge_seconds += time.perf_counter() - start

    return merge


def merge_delta(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> None:
    """`weight += scale * (B @ A)` as diffusers' `fuse_lora` does it on the CPU: factors in the weight's dtype,
    their product in float32, scaled, rounded once to the weight's dtype, added in place. Merged a block of rows
    at a time into two reused buffers, so the temporaries are one block (`MERGE_BLOCK_ELEMENTS`), not the whole
    weight; each row's product is the same dot products, so the bits equal the whole-weight merge."""
    a32 = a.to(weight.device, weight.dtype).float()
    b32 = b.to(weight.device, weight.dtype).float()
    rows, cols = weight.shape
    step = max(1, MERGE_BLOCK_ELEMENTS // cols)
    product = torch.empty(min(step, rows), cols, dtype=torch.float32, device=weight.device)
    rounded = product if weight.dtype == torch.float32 else torch.empty_like(product, dtype=weight.dtype)
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        block, block_rounded = product[: stop - start], rounded[: stop - start]
        torch.matmul(b32[start:stop], a32, out=block)
        if scale != 1.0:  # x * 1.0 is x: one pass over the product saved, the bits unchanged
            block.mul_(scale)
        if block_rounded is not block:
            block_rounded.copy_(block)
        weight[start:stop].add_(block_rounded)


def _read(lora: LoraInput, roots: Iterable[str | os.PathLike], shell: nn.Module,
          adapter: str) -> tuple[dict[str, torch.Tensor], dict[str, float], str]:
    """(factors without the partition prefix, PEFT's scale per module, sha256) of one file, opened confined to
    `roots` and checked against the hash the job recorded."""
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    from loader.confined import open_checked
    from loader.roots import ModelRoots

    shown = echo_name(lora.file)
    fd, _ = open_checked(Path(lora.file), ModelRoots(roots), f"LoRA {shown}")
    try:
        digest = file_sha256(fd)
        if lora.sha256 is not None and digest != lora.sha256:
            raise LoraError(f"LoRA {shown}: its content changed since the job was queued (sha256 {digest[:12]}...,"
                            f" recorded {lora.sha256[:12]}...); queue it again")
        # The descriptor's own path: diffusers reads the file this process opened under the roots, not whatever
        # the name points to by then, and never asks a hub (a local file, local_files_only).
        try:
            state, metadata = MiniMaxH3LoraLoaderMixin.lora_state_dict(
                f"/proc/self/fd/{fd}", use_safetensors=True, local_files_only=True, return_lora_metadata=True)
        except (OSError, ValueError, RuntimeError) as exc:
            raise LoraError(f"LoRA {shown}: diffusers cannot read it: {echo_name(exc)}") from None
    finally:
        os.close(fd)
    prefix = next(iter(state)).split(".", 1)[0] if state else ""
    factors = {k.split(".", 1)[1]: v for k, v in state.items()}
    scales = _peft_scales(shell, {k: v for k, v in state.items()}, prefix, metadata, adapter)
    return factors, scales, digest


def _meta_shell(config: dict) -> nn.Module:
    """The DiT of `config` on the meta device, where diffusers injects adapters only for their scales."""
    from .classes import build_empty

    return build_empty(config)


def _peft_scales(shell: nn.Module, state: dict[str, torch.Tensor], prefix: str, metadata: dict | None,
                 adapter: str) -> dict[str, float]:
    """Module path -> `alpha / rank` as PEFT sets it for this file (diffusers' `load_lora_adapter` on `shell`,
    with the factors' shapes only)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    shapes = {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in state.items()}
    try:
        shell.load_lora_adapter(shapes, prefix=prefix, metadata=metadata, adapter_name=adapter, low_cpu_mem_usage=True)
    except (ValueError, RuntimeError, TypeError) as exc:
        raise LoraError(f"LoRA for {prefix}: diffusers cannot place its layers: {echo_name(exc)}") from None
    return {path: float(m.scaling[adapter]) for path, m in shell.named_modules()
            if isinstance(m, BaseTunerLayer) and adapter in getattr(m, "scaling", {})}

