"""Forecast a load's peak memory from checkpoint metadata alone, before reading a tensor byte.

The peak is what `LoadReport.footprint_ratio` measures (host RSS growth plus
device allocation growth over the baseline), predicted per placement mode:

- `stream`: the model, plus the staging buffers the stream placement
  allocates (none on a CPU target in the checkpoint's dtype: bytes are read
  straight into the parameters);
- `drain`: the model, plus the mapped pages of the shard being placed (a
  shard's mapping goes once its last view is popped): the largest over shards
  of "placed through this shard + this shard" (less its last tensor, released
  before the loader's next sample), at most model + largest shard;
- `retain`: the model plus the whole checkpoint (every mapping lives to the end);
- plus dtype conversion: a device target that converts from a mapped view
  needs one converted copy of the largest such tensor on the host.

The model is every checkpoint tensor in its target dtype (as a skeleton load
places it; a registered model class's `keep_fp32` is honoured). See
docs/metrics.md for the metric and docs/benchmarks.md for measured accuracy.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass

import torch

from .metadata import ComponentMeta, TensorMeta
from .checkpoint import checked_checkpoint, checkpoint_identity
from machine.device import DeviceInfo, probe_device
from .dtypes import DtypePolicy
from .io.host_blocks import next_power_of_two
from core.errors import CheckpointError, PlacementError
from .model_registry import get_model_builder
from .naming import EXTRA_STATE_SUFFIX
from machine.memory import sample_memory
from .placement import get_placement
from .placement.ring_sizing import ring_geometry
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
    asks again on every rerun and the arithmetic runs over every tensor; except a `stream` load onto CUDA,
    whose ring depth follows MemAvailable and the page cache now.
    """
    info = device_info or probe_device(str(device))
    identity = checkpoint_identity(path)
    if identity is None or (info.kind == "cuda" and mode == "stream"):
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
    kind = info.kind
    index, problems = checked_checkpoint(path, roots)  # remembered: a page asks again on every rerun
    if problems:
        raise CheckpointError(list(problems))
    comp = index.component(component)
    builder = get_model_builder(comp.class_name)
    policy = DtypePolicy.build(dtype, None, builder.keep_fp32 if builder else ())
    tensors = [t for t in comp.tensors if not t.name.endswith(EXTRA_STATE_SUFFIX)]
    targets = [(t, policy.target_dtype(t.name, t.torch_dtype)) for t in tensors]
    model = sum(t.numel * d.itemsize for t, d in targets)
    converted = [(t, d) for t, d in targets if d != t.torch_dtype]
    staging = mapped = conversion = 0
    if placement.name == "stream":
        staging = _stream_staging(placement, targets, info)
    elif placement.name in ("drain", "retain"):
        mapped = comp.total_bytes if placement.name == "retain" else _drain_mapped_excess(comp, dict(targets))
        if kind != "cpu" and converted:
            conversion = max(t.numel * d.itemsize for t, d in converted)
    else:
        raise PlacementError(f"no forecast for placement mode {placement.name!r}; forecast knows stream, drain, retain")
    peak = model + staging + mapped + conversion
    return LoadForecast(
        component=comp.name, mode=placement.name, device=str(device), dtype=None if dtype is None else str(dtype),
        bytes_placed=model, model_bytes=model, checkpoint_bytes=comp.total_bytes,
        largest_shard_bytes=max((sum(t.nbytes for t in s.tensors) for s in comp.shards), default=0),
        staging_bytes=staging, mapped_bytes=mapped, conversion_bytes=conversion,
        predicted_peak_bytes=peak, predicted_footprint_ratio=peak / model if model else 0.0,
    )


def _stream_staging(placement, targets, info: DeviceInfo) -> int:
    """The stream placement's buffers, as it sizes them. CPU target: tensors in their stored dtype
    are read into the parameters; converted ones pass through `staging_buffers` (default 4) host
    buffers of min(staging_bytes, largest staged source). CUDA: same-dtype tensors go through the
    ring of pinned buffers `ring_geometry` sizes (deeper when the files are not in the page cache);
    converted ones through the staging buffers, pinned (the caching host allocator rounds pinned
    sizes up to a power of two), plus one device-side buffer for the conversion. Other devices
    stage everything, unpinned."""
    cuda = info.kind == "cuda"

    def path(meta: TensorMeta, dtype: torch.dtype) -> str:
        same = dtype == meta.torch_dtype
        if same and info.kind == "cpu":
            return "direct"
        return "ring" if same and cuda and placement.tuning.ranges else "staged"

    kinds = [(meta, dtype, path(meta, dtype)) for meta, dtype in targets]
    pinned = cuda and placement.tuning.pin
    total = 0
    staged = [(m, d) for m, d, k in kinds if k == "staged"]
    if staged:
        size = min(placement.converting_bytes, max(m.nbytes for m, _ in staged))
        count = placement.tuning.staging_buffers or 4
        total += count * (next_power_of_two(size) if pinned else size)
        if cuda and any(d != m.torch_dtype for m, d in staged):
            total += size
    ring_bytes = sum(m.nbytes for m, _, k in kinds if k == "ring")
    if ring_bytes:
        geometry = ring_geometry(
            ring_bytes, info, threads=placement.reader_threads(cuda=True), chunk_bytes=placement.ring_chunk_bytes,
            buffers=placement.tuning.staging_buffers, available=sample_memory().mem_available,
            read_bytes=placement.ring_read_bytes,
            disk=placement.ring_reads_disk({m.file for m, _, k in kinds if k == "ring"}),
        )
        chunk = next_power_of_two(geometry.chunk_bytes) if pinned else geometry.chunk_bytes
        total += geometry.buffers * chunk
    return total


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
