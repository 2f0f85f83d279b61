"""One rank of a parallel generate: diffusers' context parallelism on the DiT, the other weights on rank 0 only.

Every rank runs the same workflow on its own copy of the DiT, which
diffusers' `enable_parallelism(config=ContextParallelConfig(ulysses_degree=N))`
turns into one model over the ranks: its `_cp_plan` splits the packed
sequence at the first block and gathers it at the output heads, so each
rank computes 1/N of the attention rows and ends each step holding the whole
prediction (the scheduler then steps the same latents everywhere). Nothing
of the split is ours.

What this module adds around diffusers' blocks (`split_workflow`):

- the blocks before the denoising loop that read weights other than a DiT
  (the text encoder; fl2va and ref2va's VAE encodes) run on rank 0, which
  then broadcasts their outputs (`SendOutputs`); on the other ranks a
  `ReceiveOutputs` block stands in their place and writes what rank 0 sent,
  so no rank but 0 loads a text encoder or VAE;
- the decode blocks after the loop run on rank 0 only;
- `SequenceCheck`, before the loop, refuses in one line a packed sequence
  that does not divide by the ranks (diffusers' equal split requires it).

Values cross the ranks as tensors with a JSON header (names, dtypes,
shapes): nothing is pickled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from diffusers import ModularPipelineBlocks

from ..request.params import GenerateParamsError, split_problem
from ..quantization.quantize import DIT_COMPONENTS
from ..run.workflows import DENOISE_LOOP

_DTYPES = {str(t): t for t in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}
"""Tensor dtypes a broadcast carries, by their torch names."""


@dataclass(frozen=True)
class RankGroup:
    """This process's place in a parallel generate."""

    rank: int
    """Its rank (0 holds the text encoder and VAEs and writes the MP4)."""
    world: int
    """Ranks in the run."""
    device: torch.device
    """Its device (`cuda:<local rank>`, or `cpu`)."""

    @property
    def backend(self) -> str:
        """NCCL between GPUs, gloo between CPU processes."""
        return "nccl" if self.device.type == "cuda" else "gloo"

    def loads(self, component: str) -> bool:
        """Whether this rank loads `component`: rank 0 every one, the others the DiT only."""
        return self.rank == 0 or component in DIT_COMPONENTS


def enable_context_parallel(dit: torch.nn.Module, group: RankGroup) -> str:
    """Turn on diffusers' Ulysses context parallelism over the group's ranks on a loaded DiT; returns a line saying so."""
    from diffusers import ContextParallelConfig

    dit.enable_parallelism(config=ContextParallelConfig(ulysses_degree=group.world))
    return f"context parallel: Ulysses over {group.world} ranks ({group.backend})"


def rank_reads(reads: dict[str, tuple[str, ...]], group: RankGroup | None) -> dict[str, tuple[str, ...]]:
    """Block -> the weights it reads on this rank: every one on rank 0, only the DiT's elsewhere."""
    if group is None or group.rank == 0:
        return reads
    return {block: tuple(c for c in components if group.loads(c)) for block, components in reads.items()}


def rank0_blocks(reads: dict[str, tuple[str, ...]]) -> list[str]:
    """The blocks only rank 0 runs: those reading weights, none of them a DiT's."""
    return [block for block, components in reads.items()
            if components and not any(c in DIT_COMPONENTS for c in components)]


class _RankBlock(ModularPipelineBlocks):
    model_name = "minimax-h3"

    def __init__(self, group: RankGroup, names: list[tuple[str, str | None]]):
        super().__init__()
        self.group, self.names = group, names
        """(state name, its kwargs_type) of each value crossing the ranks."""


class SendOutputs(_RankBlock):
    """Rank 0, after a block only it runs: broadcasts the block's outputs to the other ranks."""

    @property
    def description(self) -> str:
        return f"Drainboard: broadcasts {', '.join(n for n, _ in self.names)} from rank 0."

    def __call__(self, components, state):
        broadcast_values({name: state.get(name) for name, _ in self.names}, self.group)
        return components, state


class ReceiveOutputs(_RankBlock):
    """Ranks 1..N-1, in place of a block only rank 0 runs: writes the outputs rank 0 broadcast."""

    def __init__(self, group: RankGroup, inner: ModularPipelineBlocks):
        super().__init__(group, [(o.name, o.kwargs_type) for o in inner.intermediate_outputs])
        self.inner = inner

    @property
    def description(self) -> str:
        return f"Drainboard: receives {', '.join(n for n, _ in self.names)} from rank 0."

    @property
    def intermediate_outputs(self):
        return self.inner.intermediate_outputs

    def __call__(self, components, state):
        values = broadcast_values(None, self.group)
        for name, kwargs_type in self.names:
            state.set(name, values[name], kwargs_type)
        return components, state


class SequenceCheck(ModularPipelineBlocks):
    """Before the denoising loop: the packed sequence must split evenly over the ranks, as diffusers' sharder needs."""

    model_name = "minimax-h3"

    def __init__(self, group: RankGroup):
        super().__init__()
        self.group = group

    @property
    def description(self) -> str:
        return f"Drainboard: checks that the packed sequence divides by {self.group.world} ranks."

    def __call__(self, components, state):
        problem = sequence_problem(state.get("token_tags"), self.group.world)
        if problem is not None:
            raise GenerateParamsError({"parallel": problem})
        return components, state


def sequence_problem(token_tags: torch.Tensor, world: int) -> str | None:
    """Why a packed sequence (its per-row modality tags: 0 video, 1 text, 2 audio) cannot split over `world` ranks."""
    counts = {name: int((token_tags == tag).sum()) for tag, name in enumerate(("video", "text", "audio"))}
    return split_problem(int(token_tags.shape[0]), world,
                         f" ({counts['text']} text, {counts['video']} video, {counts['audio']} audio)")


def split_workflow(blocks, reads: dict[str, tuple[str, ...]], group: RankGroup) -> None:
    """Edit a staged workflow's `sub_blocks` (`models.run.stage_blocks.staged_workflow` ran) for this rank: rank 0
    broadcasts after each of its own blocks before the loop; the others receive there instead and skip the rank-0
    blocks after it; every rank checks the sequence before the loop."""
    only_rank0 = set(rank0_blocks(reads))
    order = list(reads)
    loop_at = order.index(DENOISE_LOOP)
    items = list(blocks.sub_blocks.items())
    blocks.sub_blocks.clear()
    for key, block in items:
        name = key.split(":")[0]
        after_loop = name in order and order.index(name) > loop_at
        if name == DENOISE_LOOP and f"{DENOISE_LOOP}:sequence" not in blocks.sub_blocks:
            blocks.sub_blocks[f"{DENOISE_LOOP}:sequence"] = SequenceCheck(group)
        if name in only_rank0 and group.rank > 0:
            if after_loop:
                continue  # its :start, the block and its :end: decoding is rank 0's
            if key == name:
                blocks.sub_blocks[key] = ReceiveOutputs(group, block)
                continue
        blocks.sub_blocks[key] = block
        if key == name and name in only_rank0 and not after_loop:
            blocks.sub_blocks[f"{name}:send"] = SendOutputs(group, [(o.name, o.kwargs_type)
                                                                     for o in block.intermediate_outputs])


def broadcast_values(values: dict[str, Any] | None, group: RankGroup) -> dict[str, Any]:
    """Rank 0 sends `values` (tensors, None, numbers, strings, lists and dicts of them); the others pass None and get
    them back. A JSON header carries the structure and each tensor's dtype and shape; the tensors follow it."""
    device = group.device if group.backend == "nccl" else torch.device("cpu")
    if group.rank == 0:
        tensors: list[torch.Tensor] = []
        header = json.dumps(_describe(values, tensors)).encode()
        length = torch.tensor([len(header)], dtype=torch.int64, device=device)
        dist.broadcast(length, src=0)
        dist.broadcast(torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device), src=0)
        for tensor in tensors:
            dist.broadcast(tensor.detach().to(device).contiguous(), src=0)
        return values
    length = torch.zeros(1, dtype=torch.int64, device=device)
    dist.broadcast(length, src=0)
    raw = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    dist.broadcast(raw, src=0)
    return _rebuild(json.loads(bytes(raw.cpu().tolist()).decode()), device, group.device)


def _describe(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        if str(value.dtype) not in _DTYPES:
            raise TypeError(f"a {value.dtype} tensor cannot cross the ranks")
        tensors.append(value)
        return {"tensor": len(tensors) - 1, "dtype": str(value.dtype), "shape": list(value.shape)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if isinstance(value, (list, tuple)):
        return {"list": [_describe(v, tensors) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: _describe(v, tensors) for k, v in value.items()}}
    raise TypeError(f"a {type(value).__name__} cannot cross the ranks (tensors, numbers, strings, lists, dicts)")


def _rebuild(shape: Any, wire: torch.device, device: torch.device) -> Any:
    """The value `_describe` described, receiving its tensors in the order rank 0 sent them."""
    if "tensor" in shape:
        tensor = torch.empty(shape["shape"], dtype=_DTYPES[shape["dtype"]], device=wire)
        dist.broadcast(tensor, src=0)
        return tensor.to(device)
    if "value" in shape:
        return shape["value"]
    if "list" in shape:
        return [_rebuild(s, wire, device) for s in shape["list"]]
    return {k: _rebuild(s, wire, device) for k, s in shape["dict"].items()}
