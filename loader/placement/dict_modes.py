"""`retain` and `drain`: the classic dict-of-views path.

Every checkpoint tensor is collected, as safetensors' `safe_open` would, into
one dict of zero-copy views into the mmap'd shards (this is what keeps the
files resident), then each target is copied out of it. Each shard is mapped
from the descriptor discovery's validated file reopens to (`confined`), never
by path, with the header offsets discovery read from it. The two modes differ
only in whether an entry is popped as soon as it is placed.

A mapped file that shrinks under the load kills the process with SIGBUS when
a vanished page is touched; before each tensor is copied its file's size is
checked, so a shard truncated mid-load is, in most cases, one line instead
(`errors.SIGBUS_MEANING` is what the signal itself most likely means).

- `retain`: the classic loader, the dict lives until every tensor is placed
  (the "before" curve: host footprint about twice the model).
- `drain`: each entry popped as it is placed (FastVideo #1714), so about one
  shard stays mapped.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import ClassVar

import torch

from machine.device import DeviceInfo
from ..metadata import ComponentMeta, TensorMeta
from ..confined import reopen
from core.echo import NAME_LIMIT, echo, echo_name
from core.errors import CheckpointError
from .base import LoadPlan, Placement, PlacementContext, PlacementCost, register_placement


class DictPlacement(Placement):
    """Collect everything into a dict, then place target by target."""

    pop: ClassVar[bool] = False
    """Pop each entry as it is placed (`drain`) instead of keeping the dict to the end (`retain`)."""
    uses_mmap = True

    def forecast_cost(self, component: ComponentMeta, targets: list[tuple[TensorMeta, torch.dtype]],
                      device: DeviceInfo) -> PlacementCost:
        """The mapped pages (`retain`: the whole checkpoint; `drain`: the shard being placed), plus, to a device
        with a dtype change, one converted copy of the largest converted tensor on the host."""
        mapped = _drain_mapped_excess(component, dict(targets)) if self.pop else component.total_bytes
        converted = [t.numel * d.itemsize for t, d in targets if d != t.torch_dtype]
        return PlacementCost(mapped=mapped, conversion=max(converted) if device.kind != "cpu" and converted else 0)

    def collect(self, plan: LoadPlan) -> dict[str, torch.Tensor]:
        """Name -> view into the shard's mapping, for every tensor of every shard the plan touches.

        Subclasses (and tests) may wrap this to observe the dict.
        """
        by_file: dict[Path, list[TensorMeta]] = {}
        for meta in [s for planned in plan.targets for s in planned.sources] + list(plan.dropped):
            by_file.setdefault(meta.file, []).append(meta)
        state: dict[str, torch.Tensor] = {}
        for file, metas in by_file.items():
            fd = reopen(file, metas[0].checked)
            self._sizes[file] = (fd, metas[0].checked.size if metas[0].checked else os.fstat(fd).st_size)
            self._check_size(metas[0])
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY) if self._sizes[file][1] else None
            for meta in metas:
                state[meta.name] = _view(mapped, meta)
        return state

    def _check_size(self, meta: TensorMeta) -> None:
        """Refuse to touch `meta`'s pages when its file shrank since it was mapped (touching them is SIGBUS)."""
        fd, size = self._sizes[meta.file]
        now = os.fstat(fd).st_size
        if now < size:
            raise CheckpointError(
                f"{echo_name(meta.file.name)}: shrank from {size} to {now} bytes after it was validated, before tensor"
                f" {echo(meta.name, NAME_LIMIT)} was read: the file changed or shrank while it was being read; copy it again"
            )

    def place(self, plan: LoadPlan, ctx: PlacementContext) -> None:
        self._sizes: dict[Path, tuple[int, int]] = {}
        """Per mapped file, a descriptor kept open and its size when mapped."""
        try:
            state = self.collect(plan)
        except BaseException:
            self._close()
            raise
        try:
            if self.pop:
                for meta in plan.dropped:
                    state.pop(meta.name, None)
            for planned in plan.targets:
                dest = ctx.allocate(planned)
                flat = dest.view(-1)
                start = 0
                for meta in planned.sources:
                    self._check_size(meta)
                    source = state.pop(meta.name) if self.pop else state[meta.name]
                    flat[start : start + meta.numel].copy_(source.reshape(-1))
                    start += meta.numel
                    ctx.meter.read(meta.nbytes)
                    del source
                ctx.place(planned, dest)
        finally:
            state.clear()
            self._close()

    def _close(self) -> None:
        for fd, _ in self._sizes.values():
            os.close(fd)
        self._sizes.clear()


def _view(mapped: mmap.mmap | None, meta: TensorMeta) -> torch.Tensor:
    """A zero-copy view of `meta`'s bytes in its file's mapping (an empty tensor when it holds none)."""
    if meta.numel == 0 or mapped is None:
        return torch.empty(meta.shape, dtype=meta.torch_dtype)
    flat = torch.frombuffer(mapped, dtype=meta.torch_dtype, count=meta.numel, offset=meta.offset)
    return flat.view(meta.shape)


def _drain_mapped_excess(comp: ComponentMeta, target_dtype: dict[TensorMeta, torch.dtype]) -> int:
    """The drain peak minus the model: the pages of the shard being placed stay mapped (resident
    once read) until its last view is popped. The loader samples after each placed tensor, and the
    shard's last view is gone by the sample after its last tensor, so the sampled peak of shard k
    is at its next-to-last tensor: placed through k + shard k, less that last tensor (both copies)."""
    model = sum(t.numel * d.itemsize for t, d in target_dtype.items())
    placed = worst = 0
    for shard in comp.shards:
        ordered = sorted((t for t in shard.tensors if t in target_dtype), key=lambda t: t.data_offsets)
        if not ordered:
            continue
        placed += sum(t.numel * target_dtype[t].itemsize for t in ordered)
        last = ordered[-1]
        worst = max(worst, placed + sum(t.nbytes for t in ordered) - last.nbytes - last.numel * target_dtype[last].itemsize)
    return max(worst - model, 0)


@register_placement("retain")
class RetainPlacement(DictPlacement):
    """Keeps every shard mapped until the end."""

    pop = False
    summary = "keeps every mmap view until the end (the classic loader)"
    typical_footprint = 2.0
    glyph = "━"
    dash = (1, 0)


@register_placement("drain")
class DrainPlacement(DictPlacement):
    """Releases each source as it is placed; unplaced entries are popped before the first placement."""

    pop = True
    summary = "builds the dict of mmap views, pops each entry as it is placed"
    typical_footprint = 1.16
    glyph = "╍"
    dash = (8, 4)
