"""LoRAs merged into a DiT while the loader streams it: each targeted weight gets its deltas as it is placed.

The factors are read from the LoRA file as their targets come up. Before the
load, only the file's header is read: its tensors are grouped by module
(`models.lora.inputs.factor_groups`) and each group's names and shapes converted on
meta, which says what each group targets and checks it against the DiT. When the
loader places a targeted weight, that group's tensors (one module's factors, a
few MiB at H3's size) are read from the file the job hashed, converted by
diffusers' public `MiniMaxH3LoraLoaderMixin.lora_state_dict` (handed a small
in-memory safetensors file holding the group and the file's `__metadata__`, so
an `alpha` there is honoured as for the whole file; a state dict in memory would
lose it), merged, and dropped once every weight of the group is merged. What a
load holds beyond the weights is one group per LoRA, never the file.

The scale of each module is PEFT's: diffusers' metadata for the group (or, with
none, its `get_peft_kwargs`, as `load_lora_adapter` builds the config) becomes a
`LoraConfig` that PEFT's public `inject_adapter_in_model` applies to a meta
skeleton holding just the group's Linear layers; PEFT's `scaling` is read back
(rank and alpha patterns, rsLoRA, as PEFT applies them). Nothing of the loaded
DiT is wrapped: no adapter module, no second copy of any weight.

The arithmetic is diffusers' `fuse_lora` on the CPU, exactly: the factors are
rounded to the weight's dtype (PEFT holds them in the base layer's dtype),
`(B @ A)` is computed in float32 and scaled, rounded once to the weight's dtype
and added to it in that dtype; stacked LoRAs are added in the order given. On
CUDA, PEFT multiplies bf16 factors in bf16; Drainboard keeps the float32
product there too, so a CUDA run is not bit-equal to diffusers' CUDA fuse.
A quantized DiT is merged before each Linear is quantized (the loader adjusts a
tensor before anyone sees it placed).

One case differs from converting the whole file: a file that mixes per-module
`.alpha` scalars on some modules with an `alpha` in `__metadata__` (diffusers
ignores the metadata's alpha for the whole file when any module has one; per
group, it applies to the modules without). No published layout does this.
"""

from __future__ import annotations

import json
import os
import struct
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn

from core.echo import echo_name
from machine.host_heap import give_back_free_heap

from .inputs import (LoraError, LoraInput, check_factors, converted_on_meta, factor_groups, file_sha256,
                          merge_rows)


@dataclass
class LoraMerge:
    """What merging a partition's LoRAs did and held."""

    loras: list[dict[str, Any]] = field(default_factory=list)
    """Per LoRA, in merge order: file, sha256, scale, partition, targets, ranks, factor_bytes, groups."""
    factor_bytes: int = 0
    """Bytes of every converted factor, all LoRAs (read a group at a time, never held together)."""
    largest_group_bytes: int = 0
    """Bytes of the largest group read from one file (its tensors as stored)."""
    held_peak_bytes: int = 0
    """The most converted factor bytes held at once during the load (groups read and not yet fully merged)."""
    held_bytes: int = 0
    """Converted factor bytes held now."""
    read_seconds: float = 0.0
    """Hashing the files and converting their headers (before the load's first tensor)."""
    group_seconds: float = 0.0
    """Inside the load: reading the groups' tensors and converting them through diffusers and PEFT."""
    merge_seconds: float = 0.0
    """Inside the load: adding the deltas to the weights (the arithmetic alone)."""

    def to_dict(self) -> dict[str, Any]:
        return {"loras": self.loras, "factor_bytes": self.factor_bytes,
                "largest_group_bytes": self.largest_group_bytes, "held_peak_bytes": self.held_peak_bytes,
                "read_seconds": self.read_seconds,
                "group_seconds": self.group_seconds, "merge_seconds": self.merge_seconds}


Factor = tuple[torch.Tensor, torch.Tensor, float]
"""(lora_A, lora_B, scale) of one LoRA for one weight."""


class _LoraFile:
    """The descriptor a LoRA was hashed through, kept open while its groups are read; closed with the last group
    (or when the load is abandoned and its adjustments collected)."""

    def __init__(self, fd: int, shown: str, metadata: dict[str, str], scale: float, adapter: str):
        self.fd, self.shown, self.metadata, self.scale, self.adapter = fd, shown, metadata, scale, adapter
        self.open_groups = 0
        self.uniform_scales: dict[str, float] = {}
        """PEFT's scale for a config that names exactly the group's modules and no rank or alpha pattern (the same
        for every module then): PEFT is asked once per such config, not once per group."""
        self._close = weakref.finalize(self, os.close, fd)

    def group_done(self) -> None:
        self.open_groups -= 1
        if self.open_groups == 0:
            self._close()


class _Group:
    """One module's tensors of one LoRA file: read and converted when its first target is placed, dropped when its
    last is merged."""

    def __init__(self, source: _LoraFile, tensors: list, targets: list[str]):
        self.source, self.tensors, self.waiting = source, tensors, set(targets)
        self.factors: dict[str, Factor] | None = None
        self.nbytes = 0
        self.done = False
        source.open_groups += 1

    def take(self, target: str, report: LoraMerge) -> Factor:
        if self.factors is None:
            start = time.perf_counter()
            self.factors = _read_group(self.source, self.tensors)
            self.nbytes = sum(a.nbytes + b.nbytes for a, b, _ in self.factors.values())
            report.held_bytes += self.nbytes
            report.held_peak_bytes = max(report.held_peak_bytes, report.held_bytes)
            report.group_seconds += time.perf_counter() - start
        factor = self.factors.pop(target)
        self.waiting.discard(target)
        if not self.waiting:
            self.factors = None
            report.held_bytes -= self.nbytes
            self.source.group_done()
            self.done = True
        return factor


def merge_adjustments(loras: Iterable[LoraInput], partition: str, config: dict, roots: Iterable[str | os.PathLike]
                      ) -> tuple[dict[str, Callable[[torch.Tensor], None]], LoraMerge]:
    """The loader's `adjust` mapping that merges `loras` into the `partition` DiT of `config` as its weights
    are placed, and the record of it. LoraError / CheckpointError name the file."""
    from ..checkpoint.classes import build_empty

    report = LoraMerge()
    start = time.perf_counter()
    roots = list(roots)
    shapes = {n: tuple(p.shape) for n, p in build_empty(config).named_parameters()}
    per_weight: dict[str, list[_Group]] = {}
    for i, lora in enumerate(loras):
        source, groups, digest = _open(lora, roots, f"drainboard_{i}")
        converted = {k.split(".", 1)[1]: v for group in groups.values() for k, v in group[1].items()}
        targets, ranks = check_factors(converted, shapes, source.shown, partition)
        for tensors, group_converted in groups.values():
            modules = sorted({k.split(".", 1)[1].rsplit(".lora_", 1)[0] for k in group_converted})
            group = _Group(source, tensors, [f"{m}.weight" for m in modules])
            for m in modules:
                per_weight.setdefault(f"{m}.weight", []).append(group)
            report.largest_group_bytes = max(report.largest_group_bytes, sum(t.nbytes for t in tensors))
        nbytes = sum(v.numel() * v.element_size() for v in converted.values())
        report.factor_bytes += nbytes
        report.loras.append({"file": lora.file, "sha256": digest, "scale": lora.scale, "partition": partition,
                             "targets": len(targets), "ranks": sorted(set(ranks)), "factor_bytes": nbytes,
                             "groups": len(groups)})
    report.read_seconds = time.perf_counter() - start
    return {name: _merger(name, groups, report) for name, groups in per_weight.items()}, report


def _merger(target: str, groups: list[_Group], report: LoraMerge) -> Callable[[torch.Tensor], None]:
    def merge(weight: torch.Tensor) -> None:
        for group in groups:
            a, b, scale = group.take(target, report)
            start = time.perf_counter()
            merge_delta(weight, a, b, scale)
            del a, b
            report.merge_seconds += time.perf_counter() - start
        if any(group.done for group in groups):
            # A group's tensors and temporaries under glibc's mmap threshold were carved from the heap between the
            # weights placed meanwhile: hand their pages back rather than let each group's holes add up.
            start = time.perf_counter()
            give_back_free_heap()
            report.group_seconds += time.perf_counter() - start
        groups.clear()  # each group is held only by the weights still to come

    return merge


def merge_delta(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> None:
    """`weight += scale * (B @ A)` as diffusers' `fuse_lora` does it on the CPU: factors in the weight's dtype,
    their product in float32, scaled, rounded once to the weight's dtype, added in place. Merged a block of rows
    at a time into two reused buffers (`models.lora.inputs.merge_rows`: a sixteenth of the weight at most), so the
    temporaries are a fraction of this weight, not the whole of it; each row's product is the same dot products, so
    the bits equal the whole-weight merge."""
    a32 = a.to(weight.device, weight.dtype).float()
    b = b.to(weight.device, weight.dtype)
    rows, cols = weight.shape
    step = merge_rows(rows)
    product = torch.empty(step, cols, dtype=torch.float32, device=weight.device)
    rounded = product if weight.dtype == torch.float32 else torch.empty_like(product, dtype=weight.dtype)
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        block, block_rounded = product[: stop - start], rounded[: stop - start]
        torch.matmul(b[start:stop].float(), a32, out=block)  # B's rows in float32 a block at a time, as its product
        if scale != 1.0:  # x * 1.0 is x: one pass over the product saved, the bits unchanged
            block.mul_(scale)
        if block_rounded is not block:
            block_rounded.copy_(block)
        weight[start:stop].add_(block_rounded)


def _open(lora: LoraInput, roots: list, adapter: str) -> tuple[_LoraFile, dict[str, tuple[list, dict]], str]:
    """(the file kept open, group -> (its tensors, their conversion on meta), sha256) of one LoRA, opened confined to
    `roots` and checked against the hash the job recorded. Reads the whole file once (the hash) and keeps none of it."""
    from loader.confined import open_checked
    from loader.roots import ModelRoots
    from loader.safetensors_file import read_shard_header

    shown = echo_name(lora.file)
    fd, checked = open_checked(Path(lora.file), ModelRoots(roots), f"LoRA {shown}")
    try:
        digest = file_sha256(fd)
        if lora.sha256 is not None and digest != lora.sha256:
            raise LoraError(f"LoRA {shown}: its content changed since the job was queued (sha256 {digest[:12]}...,"
                            f" recorded {lora.sha256[:12]}...); queue it again")
        shard, problems = read_shard_header(checked.real, ModelRoots([checked.root]))
        if shard is None or problems:
            raise LoraError(f"LoRA {shown}: not a readable safetensors file: {'; '.join(problems)[:300]}")
        converted = converted_on_meta(shard, shown)
    except BaseException:
        os.close(fd)
        raise
    source = _LoraFile(fd, shown, dict(shard.metadata), lora.scale, adapter)
    groups = {m: (tensors, converted[m]) for m, tensors in factor_groups(shard.tensors).items()}
    return source, groups, digest


def _read_group(source: _LoraFile, tensors: list) -> dict[str, Factor]:
    """Target weight name -> (A, B, PEFT's scale times the LoRA's) for one group: its tensors copied from the LoRA's
    descriptor into a small in-memory safetensors file with the file's `__metadata__`, converted by diffusers'
    `lora_state_dict`, scaled as PEFT scales them."""
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    memfd = _group_file(source, tensors)
    try:
        state, metadata = MiniMaxH3LoraLoaderMixin.lora_state_dict(
            f"/proc/self/fd/{memfd}", use_safetensors=True, local_files_only=True, return_lora_metadata=True)
    except (OSError, ValueError, RuntimeError) as exc:
        raise LoraError(f"LoRA {source.shown}: diffusers cannot read it: {echo_name(exc)}") from None
    finally:
        os.close(memfd)
    prefix = next(iter(state)).split(".", 1)[0]
    factors = {k.split(".", 1)[1]: v for k, v in state.items()}
    scales = _peft_scales(factors, prefix, metadata, source)
    out = {}
    for module, scale in scales.items():
        out[f"{module}.weight"] = (factors.pop(f"{module}.lora_A.weight"), factors.pop(f"{module}.lora_B.weight"),
                                   scale * source.scale)
    return out


def _group_file(source: _LoraFile, tensors: list) -> int:
    """A memory file (memfd) holding `tensors` as a safetensors file with the source's `__metadata__`; the bytes go
    from the LoRA's descriptor to it in the kernel (sendfile), not through Python."""
    header: dict[str, Any] = {"__metadata__": source.metadata} if source.metadata else {}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    memfd = os.memfd_create("drainboard-lora-group", os.MFD_CLOEXEC)
    try:
        os.write(memfd, struct.pack("<Q", len(raw)) + raw)
        for t in tensors:
            sent, start = 0, t.offset
            while sent < t.nbytes:
                n = os.sendfile(memfd, source.fd, start + sent, t.nbytes - sent)
                if n == 0:
                    raise LoraError(f"LoRA {source.shown}: ends inside {echo_name(t.name)} (truncated since it was"
                                    " checked)")
                sent += n
    except BaseException:
        os.close(memfd)
        raise
    return memfd


def _peft_scales(factors: dict[str, torch.Tensor], prefix: str, metadata: dict | None,
                 source: _LoraFile) -> dict[str, float]:
    """Module path -> `alpha / rank` as PEFT sets it for these factors: the config diffusers' `load_lora_adapter`
    would build (its metadata, else `get_peft_kwargs` over the ranks), applied by PEFT to a meta skeleton of just
    these modules."""
    from diffusers.utils.peft_utils import get_peft_kwargs
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    if metadata is not None:
        kwargs = {k.removeprefix(f"{prefix}."): v for k, v in metadata.items() if k.startswith(f"{prefix}.")}
    else:
        ranks = {f"^{k}": v.shape[1] for k, v in factors.items() if "lora_B" in k and v.ndim > 1}
        kwargs = get_peft_kwargs(ranks, network_alpha_dict=None, peft_state_dict=factors)
    modules = sorted({k.rsplit(".lora_", 1)[0] for k in factors})
    uniform = (sorted(kwargs.get("target_modules") or ()) == modules and not kwargs.get("rank_pattern")
               and not kwargs.get("alpha_pattern") and not kwargs.get("exclude_modules"))
    key = json.dumps({k: v for k, v in kwargs.items() if k != "target_modules"}, sort_keys=True, default=str)
    if uniform and key in source.uniform_scales:
        return dict.fromkeys(modules, source.uniform_scales[key])
    skeleton = nn.Module()
    for module in modules:
        a, b = factors[f"{module}.lora_A.weight"], factors[f"{module}.lora_B.weight"]
        parent = skeleton
        *path, leaf = module.split(".")
        for part in path:
            child = dict(parent.named_children()).get(part)
            if child is None:
                child = nn.Module()
                parent.add_module(part, child)
            parent = child
        parent.add_module(leaf, nn.Linear(a.shape[1], b.shape[0], bias=False, device="meta"))
    try:
        inject_adapter_in_model(LoraConfig(**kwargs), skeleton, adapter_name=source.adapter, low_cpu_mem_usage=True)
    except (ValueError, RuntimeError, TypeError) as exc:
        raise LoraError(f"LoRA {source.shown}: PEFT cannot place its layers: {echo_name(exc)}") from None
    scales = {path: float(m.scaling[source.adapter]) for path, m in skeleton.named_modules()
              if isinstance(m, BaseTunerLayer) and source.adapter in getattr(m, "scaling", {})}
    missing = [m for m in modules if m not in scales]
    if missing:
        raise LoraError(f"LoRA {source.shown}: its metadata leaves {echo_name(missing[0])} out of the adapter diffusers"
                        " would build (its factors would not be merged)")
    if uniform and len(set(scales.values())) == 1:
        source.uniform_scales[key] = next(iter(scales.values()))
    return scales
