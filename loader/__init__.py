"""Drainboard's frugal checkpoint loader: discovery, validation, placement, probes, forecasts.

Names are imported on first use (PEP 562), so `import loader.errors` (and
`storage`, `jobs` listing their kinds through it) never pulls in torch; torch
loads when a torch-using name such as `load_checkpoint` is first touched.
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import CheckpointError, DeviceError, DiskFullError, DrainboardError, PlacementError

_LAZY = {
    "load_checkpoint": "api",
    "resolve_device": "api",
    "CheckpointIndex": "metadata",
    "ComponentMeta": "metadata",
    "ShardMeta": "metadata",
    "TensorMeta": "metadata",
    "AuxFolder": "metadata",
    "discover_checkpoint": "checkpoint",
    "DtypePolicy": "dtypes",
    "parse_dtype": "dtypes",
    "LoadForecast": "forecast",
    "forecast_load": "forecast",
    "MemoryProbe": "memory",
    "MemorySample": "memory",
    "PeriodicSampler": "memory",
    "sample_memory": "memory",
    "register_model_builder": "model_registry",
    "MergeRule": "naming",
    "Placement": "placement",
    "get_placement": "placement",
    "known_placements": "placement",
    "register_placement": "placement",
    "read_into": "reading",
    "LoadReport": "report",
    "TensorPlaced": "report",
    "ModelRoots": "roots",
    "validate_checkpoint": "validate",
}
"""Public name -> the submodule defining it, imported on first access."""

__all__ = sorted(["CheckpointError", "DeviceError", "DiskFullError", "DrainboardError", "PlacementError", *_LAZY])


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'loader' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
