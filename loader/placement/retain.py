"""`retain`: the classic loader, the dict of views lives until every tensor is placed (the "before" curve)."""

from __future__ import annotations

from .base import register_placement
from .dict_modes import DictPlacement


@register_placement("retain")
class RetainPlacement(DictPlacement):
    """Keeps every shard mapped until the end: host footprint about twice the model."""

    pop = False
