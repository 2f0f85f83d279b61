"""`drain`: the dict of views, popped entry by entry (FastVideo #1714), so about one shard stays mapped."""

from __future__ import annotations

from .base import register_placement
from .dict_modes import DictPlacement


@register_placement("drain")
class DrainPlacement(DictPlacement):
    """Releases each source as it is placed; unplaced entries are popped before the first placement."""

    pop = True
