"""Drainboard's frugal checkpoint loader: discovery, validation, placement, forecasts.

Names are imported on first use (PEP 562), so `import loader` never pulls in
torch; torch loads when a torch-using name such as `load_checkpoint` is first
touched. The error types are the foundation's (`core`), the device and memory
probes the machine's (`machine`); the I/O engine is `loader.io`.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "load_checkpoint": "api",
    "LoadOptions": "options",
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
    "register_model_builder": "model_registry",
    "MergeRule": "naming",
    "SplitRule": "naming",
    "Placement": "placement",
    "get_placement": "placement",
    "known_placements": "placement",
    "register_placement": "placement",
    "read_into": "io.reading",
    "packed_bytes": "io.host_blocks",
    "prefer_host_registration": "io.host_blocks",
    "release_cached_host_memory": "io.host_blocks",
    "LoadReport": "report",
    "TensorPlaced": "report",
    "ModelRoots": "roots",
    "validate_checkpoint": "validate",
}
"""Public name -> the submodule defining it, imported on first access."""

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'loader' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
