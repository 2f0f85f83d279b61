"""Placement modes. Importing this package registers the built-in ones."""

from . import dict_modes, stream  # noqa: F401  (registration)
from .base import (LoadPlan, Placement, PlacementContext, PlacementCost, PlannedTarget, get_placement, known_placements,
                   modes_help, placement_class, placement_classes, register_placement)

__all__ = [
    "LoadPlan",
    "Placement",
    "PlacementContext",
    "PlacementCost",
    "PlannedTarget",
    "get_placement",
    "known_placements",
    "modes_help",
    "placement_class",
    "placement_classes",
    "register_placement",
]
