"""Forecast a load's peak memory from checkpoint metadata alone, before reading a tensor byte.

The peak is what `LoadReport.footprint_ratio` measures (host RSS growth plus
device allocation growth over the baseline): the model, plus what the placement
mode holds beside it at the peak, which each mode forecasts itself
(`Placement.forecast_cost`: `stream` its staging buffers, `drain` the mapped
pages of the shard being placed, `retain` the whole checkpoint, and a mapped
mode's converted copy on its way to a device).

The model is every checkpoint tensor in its target dtype (as a skeleton load
places it; a registered model class's `keep_fp32` is honoured). See
docs/metrics.md for the metric and docs/benchmarks.md for measured accuracy.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass

import torch

from .checkpoint import checked_checkpoint, checkpoint_identity
from machine.device import DeviceInfo, probe_device
from .dtypes import DtypePolicy
from core.errors import CheckpointError
from .model_registry import get_model_builder
from .naming import EXTRA_STATE_SUFFIX
from .placement import get_placement, placement_class
from .roots import RootsArg


@dataclass(frozen=True)
class LoadForecast:
    """Predicted cost of one load; every size in bytes."""

    component: str
    """Component forecast."""
    mode: str
    """Placement mode."""
    device: str
    """Target device spec."""
    dtype: str | None
    """Requested dtype (None keeps the checkpoint's)."""
    bytes_placed: int
    """Bytes the load will place (every tensor in its target dtype): the ratio's denominator."""
    model_bytes: int
    """The destination tensors (equal to bytes_placed)."""
    checkpoint_bytes: int
    """Tensor bytes on disk."""
    largest_shard_bytes: int
    """Tensor bytes of the largest shard."""
    staging_bytes: int
    """Stream staging buffers (host, pinned to a device, plus the device-side conversion buffer)."""
    mapped_bytes: int
    """Checkpoint pages resident through mappings at the peak (drain: one shard; retain: all)."""
    conversion_bytes: int
    """Transient converted copies outside staging (drain/retain to a device with a dtype change)."""
    predicted_peak_bytes: int
    """Largest predicted (RSS - base) + (device allocated - base) during the load."""
    predicted_footprint_ratio: float
    """predicted_peak_bytes / bytes_placed: the forecast of LoadReport.footprint_ratio."""

    def to_dict(self) -> dict:
        return asdict(self)


def forecast_load(
    path: str | os.PathLike,
    *,
    component: str | None = None,
    mode: str = "stream",
    device: str = "cpu",
    dtype: str | torch.dtype | None = None,
    roots: RootsArg = None,
    device_info: DeviceInfo | None = None,
) -> LoadForecast:
    """Forecast loading `component` of `path` with `mode` onto `device` in `dtype`, from headers only.

    The device need not be present (a CUDA load can be forecast on a CPU box): it is probed
    without a CUDA context, or described by `device_info` (its memory and unified-ness size
    the CUDA staging ring).
    Raises CheckpointError (as discovery does) or PlacementError (unknown mode or dtype).

    Remembered by the checkpoint's files' identity (`checkpoint_identity`) and the arguments, since a page
    asks again on every rerun and the arithmetic runs over every tensor; except a load onto CUDA with a mode
    whose forecast reads memory now (`forecast_reads_memory`: `stream`'s ring follows MemAvailable and the page
    cache).
    """
    info = device_info or probe_device(str(device))
    identity = checkpoint_identity(path)
    if identity is None or (info.kind == "cuda" and placement_class(mode).forecast_reads_memory):
        return _forecast(path, component, mode, device, dtype, roots, info)
    return _remembered(str(path), component, mode, str(device), dtype,
                       None if roots is None else tuple(str(r) for r in roots), info, identity)


@functools.lru_cache(maxsize=32)
def _remembered(path: str, component: str | None, mode: str, device: str, dtype: str | torch.dtype | None,
                roots: tuple[str, ...] | None, info: DeviceInfo, identity: tuple) -> LoadForecast:
    """`_forecast`, one entry per checkpoint state and arguments (`identity` is only the key)."""
    return _forecast(path, component, mode, device, dtype, roots, info)


def _forecast(path: str | os.PathLike, component: str | None, mode: str, device: str,
              dtype: str | torch.dtype | None, roots: RootsArg, info: DeviceInfo) -> LoadForecast:
    placement = get_placement(mode)
    index, problems = checked_checkpoint(path, roots)  # remembered: a page asks again on every rerun
    if problems:
        raise CheckpointError(list(problems))
    comp = index.component(component)
    builder = get_model_builder(comp.class_name)
    policy = DtypePolicy.build(dtype, None, builder.keep_fp32 if builder else ())
    tensors = [t for t in comp.tensors if not t.name.endswith(EXTRA_STATE_SUFFIX)]
    targets = [(t, policy.target_dtype(t.name, t.torch_dtype)) for t in tensors]
    model = sum(t.numel * d.itemsize for t, d in targets)
    cost = placement.forecast_cost(comp, targets, info)
    peak = model + cost.staging + cost.mapped + cost.conversion
    return LoadForecast(
        component=comp.name, mode=placement.name, device=str(device), dtype=None if dtype is None else str(dtype),
        bytes_placed=model, model_bytes=model, checkpoint_bytes=comp.total_bytes,
        largest_shard_bytes=max((sum(t.nbytes for t in s.tensors) for s in comp.shards), default=0),
        staging_bytes=cost.staging, mapped_bytes=cost.mapped, conversion_bytes=cost.conversion,
        predicted_peak_bytes=peak, predicted_footprint_ratio=peak / model if model else 0.0,
    )
