"""Placement modes. Importing this package registers the built-in ones."""

from . import dict_modes, stream  # noqa: F401  (registration)
from .base import LoadPlan, Placement, PlacementContext, PlannedTarget, get_placement, known_placements, register_placement

__all__ = [
    "LoadPlan",
    "Placement",
    "PlacementContext",
    "PlannedTarget",
    "get_placement",
    "known_placements",
    "register_placement",
]
