"""`retain` and `drain`: the classic dict-of-views path.

Every checkpoint tensor is collected with safetensors' `safe_open` into one
dict of zero-copy views into the mmap'd shards (this is what keeps the files
resident), then each target is copied out of it. The two modes differ only
in whether an entry is popped as soon as it is placed.

- `retain`: the classic loader, the dict lives until every tensor is placed
  (the "before" curve: host footprint about twice the model).
- `drain`: each entry popped as it is placed (FastVideo #1714), so about one
  shard stays mapped.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from safetensors import safe_open

from .base import LoadPlan, Placement, PlacementContext, register_placement


class DictPlacement(Placement):
    """Collect everything into a dict, then place target by target."""

    pop: ClassVar[bool] = False
    """Pop each entry as it is placed (`drain`) instead of keeping the dict to the end (`retain`)."""

    def collect(self, plan: LoadPlan) -> dict[str, torch.Tensor]:
        """Name -> view into the shard's mapping, for every tensor of every shard the plan touches.

        Subclasses (and tests) may wrap this to observe the dict.
        """
        state: dict[str, torch.Tensor] = {}
        for file in plan.files:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    state[name] = f.get_tensor(name)
        return state

    def place(self, plan: LoadPlan, ctx: PlacementContext) -> None:
        state = self.collect(plan)
        try:
            if self.pop:
                for meta in plan.dropped:
                    state.pop(meta.name, None)
            for planned in plan.targets:
                dest = ctx.allocate(planned)
                flat = dest.view(-1)
                start = 0
                for meta in planned.sources:
                    source = state.pop(meta.name) if self.pop else state[meta.name]
                    flat[start : start + meta.numel].copy_(source.reshape(-1))
                    start += meta.numel
                    ctx.meter.read(meta.nbytes)
                    del source
                ctx.place(planned, dest)
        finally:
            state.clear()


@register_placement("retain")
class RetainPlacement(DictPlacement):
    """Keeps every shard mapped until the end."""

    pop = False


@register_placement("drain")
class DrainPlacement(DictPlacement):
    """Releases each source as it is placed; unplaced entries are popped before the first placement."""

    pop = True
