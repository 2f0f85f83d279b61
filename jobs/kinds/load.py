"""The `load` job: load one checkpoint with a chosen placement mode and record memory per tensor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobs.context import JobContext
from jobs.kinds import job_kind
from jobs.probe import decide_offload

if TYPE_CHECKING:
    from jobs.spec import JobSpec  # annotations only: listing kinds stays torch-free


@job_kind("load")
def run_load(spec: JobSpec, ctx: JobContext) -> dict[str, Any]:
    """Probe the device, resolve the offload policy once (decisions become events), load the
    checkpoint recording a sample every `spec.sample_every` tensors, and return the loader's report.
    Every file the checkpoint names must resolve under the configured model roots. A component whose
    class is registered (the models package's builders) is built as that class and must match it
    name for name and shape for shape, as a generate's load must; `spec.skeleton` loads it generically."""
    from loader.api import load_checkpoint
    from loader.options import LoadOptions
    from models.components import register_builders

    device, _, _ = decide_offload(spec, ctx)

    def on_tensor(placed) -> None:
        done = placed.index  # 1-based
        ctx.progress(done, placed.total)
        if done % ctx.sample_every == 0 or done == placed.total:
            ctx.record(placed.sample, tensors_placed=done, bytes_placed=placed.bytes_placed, tensor_name=placed.name)

    if spec.gpus > 1:
        return _run_sharded(spec, ctx)
    roots = ctx.config.model_roots
    if not spec.skeleton:
        register_builders()  # a known class is built as generate builds it, and checked as strictly
    forecast = _record_forecast(spec, ctx, roots, device)
    with ctx.stage("load"):
        # Nothing placed yet: the process at its first weight, what this machine's next jobs learn their start-up from.
        ctx.record(tensors_placed=0, bytes_placed=0)
        _, report = load_checkpoint(
            spec.model,
            LoadOptions(component=spec.component, mode=spec.mode, device=spec.device, device_info=device, dtype=spec.dtype,
                        roots=roots, drop_page_cache=spec.drop_page_cache, skeleton=spec.skeleton),
            on_tensor=on_tensor, probe=ctx.probe,
        )
    return {**report.to_dict(), "forecast": forecast}


def _record_forecast(spec: JobSpec, ctx: JobContext, roots, device) -> dict[str, Any] | None:
    """The loader's forecast from headers alone, recorded before the first byte is read (an event,
    so a job killed mid-load still has it) and returned for the metrics: predicted beside measured."""
    from core.errors import DrainboardError
    from loader.forecast import forecast_load
    from core.sizes import format_size

    try:
        forecast = forecast_load(spec.model, component=spec.component, mode=spec.mode, device=spec.device,
                                 dtype=spec.dtype, roots=roots, device_info=device).to_dict()
    except DrainboardError:
        return None  # the load itself names what is wrong, a moment later
    ctx.event("forecast", f"predicted peak {format_size(forecast['predicted_peak_bytes'])} "
                          f"({forecast['predicted_footprint_ratio']:.3f}x the model)", data=forecast)
    return forecast


def _run_sharded(spec: JobSpec, ctx: JobContext) -> dict[str, Any]:
    """`spec.gpus` ranks, each reading only its slices; every rank's samples recorded under its rank.

    The metrics are the aggregate (the load report's metric names) plus a `ranks` list of per-rank reports.
    """
    from loader.sharded.launch import launch_sharded

    def on_rank_tensor(rank: int, placed) -> None:
        done = placed.index
        if rank == 0:
            ctx.progress(done, placed.total)
        if done % ctx.sample_every == 0 or done == placed.total:
            ctx.record(placed.sample, tensors_placed=done, bytes_placed=placed.bytes_placed,
                       tensor_name=placed.name, rank=rank)

    with ctx.stage("load"):
        result = launch_sharded(
            spec.model, spec.gpus, device=spec.device.split(":")[0], component=spec.component, dtype=spec.dtype,
            on_tensor=on_rank_tensor,
        )
    return {**result["aggregate"], "ranks": result["ranks"]}
