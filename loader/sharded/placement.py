"""Sharded placement: each rank of a 1-D device mesh reads only its own dim-0 slices.

The split is FSDP2's `Shard(0)`: `torch.chunk` semantics, so every rank but
the last few holds ceil(rows / world) rows and trailing ranks may hold fewer
or none. A dim-0 slice of a row-major tensor is one contiguous byte range of
the shard file, so the plan is rewritten into per-rank slices (plain
`TensorMeta`s with narrowed offsets) and handed to the `stream` placement
unchanged: the same positioned reads, pinned staging and overlap, only
fewer bytes. Each local slice is wrapped as a DTensor (`Shard(0)`, the
global shape and stride) without any collective.

FSDP2 treats a parameter that already is a DTensor as tensor-parallel and
would shard it again, so with `fsdp=True` (the default) the placement first
applies `fully_shard` to the still-empty (meta) module, one unit per
indexed block plus the root, and then hands each slice to FSDP through
`load_state_dict(assign=True)`, the path FSDP2 supports for
materialising sharded parameters. The module that comes back is ready for
a forward pass; no rank ever holds a whole tensor, nothing is broadcast.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard

from ..metadata import TensorMeta
from core.errors import PlacementError
from ..naming import Target
from ..placement.base import LoadPlan, Placement, PlacementContext, PlannedTarget
from ..placement.stream import StreamPlacement
from .report import ShardedPhases

DEFAULT_SHARD_MODULES = r"(^|\.)\d+$"
"""Modules wrapped as FSDP units by default: every indexed block (`transformer_blocks.7`, `layers.0`)."""


def shard_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """[start, stop) of dim 0 that `rank` owns: torch.chunk's split, as FSDP2's Shard(0) uses it."""
    chunk = -(-rows // world)
    start = min(rank * chunk, rows)
    return start, min(start + chunk, rows)


def slice_rows(meta: TensorMeta, start: int, stop: int) -> TensorMeta:
    """`meta` narrowed to rows [start, stop): one contiguous byte range of the same file."""
    row_bytes = meta.nbytes // meta.shape[0] if meta.shape[0] else 0
    begin = meta.data_offsets[0]
    return replace(
        meta,
        shape=(stop - start, *meta.shape[1:]),
        data_offsets=(begin + start * row_bytes, begin + stop * row_bytes),
    )


def local_target(planned: PlannedTarget, rank: int, world: int) -> PlannedTarget:
    """The part of `planned` that `rank` reads: its dim-0 rows, cut from each source it overlaps.

    A merged target (sources concatenated along dim 0) may take rows from
    several sources; sources it does not overlap are left out, so an empty
    share reads nothing.
    """
    start, stop = shard_rows(planned.target.shape[0], rank, world)
    sources, offset = [], 0
    for meta in planned.sources:
        lo, hi = max(start, offset), min(stop, offset + meta.shape[0])
        if lo < hi:
            sources.append(slice_rows(meta, lo - offset, hi - offset))
        offset += meta.shape[0]
    shape = (stop - start, *planned.target.shape[1:])
    return PlannedTarget(Target(planned.name, tuple(sources), shape), planned.dtype)


class ShardedContext(PlacementContext):
    """Installs each local slice as a `Shard(0)` DTensor (buffers and 0-d tensors whole, as read).

    Adds the time spent allocating and assigning to `phases`.
    """

    def __init__(
        self, inner: PlacementContext, mesh: DeviceMesh, global_shapes: dict[str, tuple[int, ...]], phases: ShardedPhases
    ):
        super().__init__(inner.module, inner.device, inner.meter)
        self.mesh = mesh
        self._global_shapes = global_shapes
        self._phases = phases

    def allocate(self, planned: PlannedTarget) -> torch.Tensor:
        start = time.perf_counter()
        tensor = super().allocate(planned)
        self._phases.allocate += time.perf_counter() - start
        return tensor

    def place(self, planned: PlannedTarget, tensor: torch.Tensor) -> None:
        start = time.perf_counter()
        self._assign(planned, tensor)
        self._phases.assign += time.perf_counter() - start
        self.meter.placed(planned.name, planned.nbytes)

    def _assign(self, planned: PlannedTarget, tensor: torch.Tensor) -> None:
        shape = self._global_shapes.get(planned.name)
        value: torch.Tensor = tensor
        if shape is not None:
            if self.device.type == "cuda" and tensor.shape[0] < -(-shape[0] // self.mesh.size()):
                # FSDP re-pads a short shard by copying it on the current stream, while the
                # stream placement may still be filling it on its side stream: wait for that.
                torch.cuda.synchronize(self.device)
            stride = torch.empty(shape, device="meta").stride()
            value = DTensor.from_local(tensor, self.mesh, [Shard(0)], run_check=False, shape=shape, stride=stride)
        assign(self.module, planned.name, value)


def assign(module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Put `value` in as parameter or buffer `name` through its owner's `load_state_dict(assign=True)`.

    That call runs FSDP2's hooks on the owner, which re-pad a short last
    shard and register the new local tensor as the sharded parameter.
    """
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if leaf not in owner._parameters and leaf not in owner._buffers:
        raise PlacementError(f"module has no parameter or buffer {name!r}")
    owner.load_state_dict({leaf: value}, strict=False, assign=True)


def wrap_fully_shard(module: nn.Module, mesh: DeviceMesh, pattern: str = DEFAULT_SHARD_MODULES) -> list[str]:
    """Apply `fully_shard` to every outermost module whose name matches `pattern`, then to the root.

    Runs on the meta module before any byte is read; returns the unit names
    (the root as ""). A 0-d parameter cannot be sharded on dim 0, so one
    raises PlacementError naming it instead of FSDP's assertion.
    """
    scalars = [n for n, p in module.named_parameters() if p.dim() == 0]
    if scalars:
        raise PlacementError(
            f"FSDP cannot shard 0-d parameter(s) {', '.join(scalars)} on dim 0; load with fsdp=False"
        )
    regex = re.compile(pattern)
    units: list[str] = []
    for name, child in module.named_modules():
        if name and regex.search(name) and not any(name.startswith(u + ".") for u in units):
            units.append(name)
    for name in units:
        fully_shard(module.get_submodule(name), mesh=mesh)
    fully_shard(module, mesh=mesh)
    return units + [""]


class ShardedPlacement(Placement):
    """Reads this rank's dim-0 slices with `stream` and installs them as DTensor shards.

    Options: `mesh` (a 1-D DeviceMesh; its rank and size decide the slices),
    `fsdp` (wrap the module with `fully_shard` first, default True),
    `shard_modules` (regex of module names that become FSDP units), and
    every `stream` option (`threads`, `staging_bytes`, `pin`, `drop_page_cache`, ...).
    """

    name = "sharded"
    options = ("mesh", "fsdp", "shard_modules") + StreamPlacement.options

    def __init__(self, **options):
        super().__init__(**options)
        mesh = options.get("mesh")
        if not isinstance(mesh, DeviceMesh) or mesh.ndim != 1:
            raise PlacementError(f"sharded placement needs a 1-D DeviceMesh as mesh=, got {mesh!r}")
        self.mesh = mesh
        self.rank = mesh.get_local_rank()
        self.world = mesh.size()
        self.fsdp = bool(options.get("fsdp", True))
        self.shard_modules = options.get("shard_modules") or DEFAULT_SHARD_MODULES
        try:
            re.compile(self.shard_modules)
        except re.error as exc:
            raise PlacementError(f"shard_modules {self.shard_modules!r} is not a valid regex: {exc}") from None
        self.stream = StreamPlacement(**{k: v for k, v in options.items() if k in StreamPlacement.options})
        self.phases = ShardedPhases()
        """Time by phase of the last load (set-up included)."""
        start = time.perf_counter()
        # The DTensor runtime's first use imports torch._dynamo (about 27 MiB of host memory and
        # most of a second), a fixed setup cost like importing torch; pay it before the load.
        DTensor.from_local(torch.empty(0), mesh, [Shard(0)], run_check=False, shape=(0,), stride=(1,))
        self._warmup_seconds = time.perf_counter() - start
        self.units: list[str] = []
        """FSDP units wrapped by the last `prepare` (empty without fsdp)."""
        self.share_bytes = 0
        """Checkpoint bytes of this rank's slices in the last load: what it reads."""
        self.checkpoint_bytes = 0
        """Checkpoint bytes of every planned tensor in the last load: what one unsharded load reads."""
        self._local: tuple[LoadPlan, LoadPlan, dict[str, tuple[int, ...]]] | None = None

    def local_plan(self, plan: LoadPlan, module: nn.Module) -> tuple[LoadPlan, dict[str, tuple[int, ...]]]:
        """(this rank's plan, global shape of every target placed as a shard).

        Parameters of one or more dimensions are sliced; buffers and 0-d
        parameters are read whole by every rank (FSDP2 shards parameters only).
        """
        params = {n for n, _ in module.named_parameters()}
        targets, shapes = [], {}
        for planned in plan.targets:
            if planned.name in params and len(planned.target.shape) > 0:
                shapes[planned.name] = planned.target.shape
                targets.append(local_target(planned, self.rank, self.world))
            else:
                targets.append(planned)
        return LoadPlan(targets=targets, dropped=plan.dropped), shapes

    def prepare(self, plan: LoadPlan, ctx: PlacementContext) -> None:
        """This rank's plan and `fully_shard` on the empty module: set-up, before the baseline and the clock."""
        start = time.perf_counter()
        self.phases = ShardedPhases()
        local, shapes = self.local_plan(plan, ctx.module)
        self.checkpoint_bytes = sum(p.target.source_bytes for p in plan.targets)
        self.share_bytes = sum(p.target.source_bytes for p in local.targets)
        self.units = wrap_fully_shard(ctx.module, self.mesh, self.shard_modules) if self.fsdp else []
        self._local = (plan, local, shapes)
        self.phases.setup = self._warmup_seconds + time.perf_counter() - start
        self._warmup_seconds = 0.0

    def place(self, plan: LoadPlan, ctx: PlacementContext) -> None:
        if self._local is None or self._local[0] is not plan:
            self.prepare(plan, ctx)
        _, local, shapes = self._local
        self._local = None
        start = time.perf_counter()
        self.stream.place(local, ShardedContext(ctx, self.mesh, shapes, self.phases))
        streamed = time.perf_counter()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        self.phases.sync = time.perf_counter() - streamed
        self.phases.read = streamed - start - self.phases.allocate - self.phases.assign

