"""Drainboard's frugal checkpoint loader: discovery, validation, placement, probes."""

from .api import load_checkpoint, resolve_device
from .checkpoint import CheckpointIndex, ComponentMeta, ShardMeta, TensorMeta, discover_checkpoint
from .dtypes import DtypePolicy, parse_dtype
from .errors import CheckpointError, DeviceError, DrainboardError, PlacementError
from .memory import MemoryProbe, MemorySample, PeriodicSampler, sample_memory
from .model_registry import register_model_builder
from .naming import MergeRule
from .placement import Placement, get_placement, known_placements, register_placement
from .reading import read_into
from .report import LoadReport, TensorPlaced
from .validate import validate_checkpoint

__all__ = [
    "CheckpointError",
    "CheckpointIndex",
    "ComponentMeta",
    "DeviceError",
    "DrainboardError",
    "DtypePolicy",
    "LoadReport",
    "MemoryProbe",
    "MemorySample",
    "MergeRule",
    "PeriodicSampler",
    "Placement",
    "PlacementError",
    "ShardMeta",
    "TensorMeta",
    "TensorPlaced",
    "discover_checkpoint",
    "get_placement",
    "known_placements",
    "load_checkpoint",
    "parse_dtype",
    "read_into",
    "register_model_builder",
    "register_placement",
    "resolve_device",
    "sample_memory",
    "validate_checkpoint",
]
