"""The `load` job: load one checkpoint with a chosen placement mode and record memory per tensor."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from jobs.context import JobContext
from jobs.errors import Problems
from jobs.kinds import JobKind, job_kind
from jobs.probe import decide_offload
from storage.config import Config

if TYPE_CHECKING:
    from jobs.admission import KindForecast
    from jobs.spec import JobSpec  # annotations only: listing kinds stays torch-free
    from machine.device import DeviceInfo


@dataclass(frozen=True)
class LoadJobOptions:
    """A load job's own fields (the loader's own options are `loader.options.LoadOptions`)."""

    skeleton: bool = False
    """Build the module from the checkpoint's own names and shapes, not its config's registered class (a
    checkpoint of another layout); False checks names and shapes strictly, as generate does."""
    drop_page_cache: bool | None = None
    """Drop each shard's pages from the page cache once placed; None leaves it to the policy's default."""


def run_load(spec: JobSpec, ctx: JobContext) -> dict[str, Any]:
    """Probe the device, resolve the offload policy once (decisions become events), load the
    checkpoint recording a sample every `spec.sample_every` tensors, and return the loader's report.
    Every file the checkpoint names must resolve under the configured model roots. A component whose
    class is registered (the models package's builders) is built as that class and must match it
    name for name and shape for shape, as a generate's load must; `skeleton` loads it generically."""
    from loader.api import load_checkpoint
    from loader.options import LoadOptions
    from models.checkpoint.components import register_builders

    device, _, _ = decide_offload(spec, ctx)
    options: LoadJobOptions = spec.options

    def on_tensor(placed) -> None:
        done = placed.index  # 1-based
        ctx.progress(done, placed.total)
        if done % ctx.sample_every == 0 or done == placed.total:
            ctx.record(placed.sample, tensors_placed=done, bytes_placed=placed.bytes_placed, tensor_name=placed.name)

    if spec.gpus > 1:
        return _run_sharded(spec, ctx)
    roots = ctx.config.model_roots
    if not options.skeleton:
        register_builders()  # a known class is built as generate builds it, and checked as strictly
    forecast = _record_forecast(spec, ctx, roots, device)
    with ctx.stage("load"):
        # Nothing placed yet: the process at its first weight, what this machine's next jobs learn their start-up from.
        ctx.record(tensors_placed=0, bytes_placed=0)
        _, report = load_checkpoint(
            spec.model,
            LoadOptions(component=spec.component, mode=spec.mode, device=spec.device, device_info=device, dtype=spec.dtype,
                        roots=roots, drop_page_cache=options.drop_page_cache, skeleton=options.skeleton),
            on_tensor=on_tensor, probe=ctx.probe,
        )
    return {**report.to_dict(), "forecast": forecast}


@job_kind("load")
class LoadKind(JobKind):
    """Load one checkpoint (a component) with a placement mode, recording memory per tensor."""

    summary = "load a checkpoint and record memory per tensor"
    example = "python -m jobs submit load --model data/models/demo --mode drain --wait"
    options = LoadJobOptions
    reads_checkpoint = True

    @classmethod
    def check(cls, raw: Mapping[str, Any], spec: Mapping[str, Any], config: Config, problems: Problems) -> LoadJobOptions:
        """`skeleton` for a one-rank load; `drop_page_cache` for a one-rank `stream` load, the only one that drops
        pages it read (anywhere else it would change nothing, so it is refused rather than ignored)."""
        skeleton, drop = raw.get("skeleton", False), raw.get("drop_page_cache")
        gpus = spec["gpus"] or 1
        if type(skeleton) is not bool:
            problems.add("skeleton", f"must be true or false, got {skeleton!r}")
            skeleton = False
        elif skeleton and gpus > 1:
            problems.add("skeleton", f"sharded loads ({gpus} GPUs) do not take it")
        if drop is not None and not isinstance(drop, bool):
            problems.add("drop_page_cache", f"must be true, false or unset (the policy default), got {drop!r}")
            drop = None
        elif drop is not None and spec["mode"] != "stream":
            problems.add("drop_page_cache", f"only the stream mode drops the page cache, not {spec['mode']!r}")
        elif drop is not None and gpus > 1:
            problems.add("drop_page_cache", f"sharded loads ({gpus} GPUs) do not apply it")
        return LoadJobOptions(skeleton=skeleton, drop_page_cache=drop)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--drop-page-cache", action=argparse.BooleanOptionalAction,
                            help="drop each shard's page cache once placed (default: the policy's)")
        parser.add_argument("--skeleton", action="store_true",
                            help="load the tensors as a generic checkpoint, even where the config names a known class")

    @classmethod
    def arguments(cls, args: argparse.Namespace) -> dict[str, Any]:
        return {"drop_page_cache": args.drop_page_cache, **({"skeleton": True} if args.skeleton else {})}

    @classmethod
    def forecast(cls, spec: JobSpec, device: DeviceInfo, db) -> KindForecast | None:
        """The loader's own forecast of a one-rank load (`loader.forecast_load`): one stage, its mapped pages
        file-backed; none for a sharded load."""
        from jobs.admission import KindForecast
        from machine.walls import StageNeed
        from loader.forecast import forecast_load

        if spec.gpus != 1:
            return None
        f = forecast_load(spec.model, component=spec.component, mode=spec.mode, device=spec.device, dtype=spec.dtype,
                          device_info=device)
        on_device = f.model_bytes if device.kind != "cpu" else 0
        return KindForecast([StageNeed(f"load.{f.component}", f.predicted_peak_bytes - on_device, on_device,
                                       f.mapped_bytes)])

    run = staticmethod(run_load)


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
