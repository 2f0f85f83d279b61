"""The `generate` job: MiniMax H3 (t2va, fl2va or ref2va) into an MP4 artifact, recording memory per stage.

Input images are read from the job's own copies (`jobs.input_copies`), never from the path the user gave.
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from jobs.context import JobContext
from jobs.kinds import job_kind
from jobs.probe import decide_offload

if TYPE_CHECKING:
    from jobs.spec import JobSpec  # annotations only: listing kinds stays torch-free

RANK_STAGE = "rank_stage"
"""The event a rank other than 0 records when one of its stages ends (rank 0's stages are the job's)."""
SAMPLE_INTERVAL = 0.1
"""Seconds between timer samples during generate stages."""

_EVENT_KINDS = {"load": "load", "release": "release", "placement": "placement", "note": "note"}
"""Pipeline event kinds recorded as job events, and the job event kind each becomes (the offload decisions
are the probe stage's, recorded there; the pipeline takes them as handed down and only repeats them)."""


class _Stages:
    """Turns the pipeline's stage_start/stage_end events into the context's stages.

    The pipeline reports edges, the context offers a `with` block: the open
    block is entered on a start and left on the matching end, or left with the
    exception when the run fails inside it (the stage then ends "aborted").
    """

    def __init__(self, ctx: JobContext):
        self._ctx = ctx
        self._open: AbstractContextManager | None = None

    def start(self, name: str) -> None:
        self.end()
        self._open = self._ctx.stage(name)
        self._open.__enter__()

    def end(self) -> None:
        if self._open is not None:
            stage, self._open = self._open, None
            stage.__exit__(None, None, None)

    def abort(self) -> None:
        if self._open is not None:
            stage, self._open = self._open, None
            stage.__exit__(*sys.exc_info())


@job_kind("generate")
def run_generate_job(spec: JobSpec, ctx: JobContext) -> dict[str, Any]:
    """Probe the device and resolve the offload policy once (decisions become events), generate
    `spec.generate` into the job's `video.mp4`, mirror the pipeline's stages (one per block, one per
    component load), denoising steps (as progress), placements, loads and releases into the job,
    sample memory on a timer tagged with the stage, and return the pipeline's result: stage timings
    (`stage_seconds`), per-stage peak footprint (`stage_peaks`), the offload settings and the diffusers
    mechanism each component got (`placements`), and each component's load report (`loads`)."""
    from dataclasses import replace

    from jobs.input_copies import input_copies
    from loader.dtypes import parse_dtype
    from models.pipeline import PipelineEvent, run_generate

    if spec.generate is None:
        raise ValueError("a generate job needs generate parameters")
    params = replace(spec.generate, **input_copies(ctx.data_dir, ctx.job_id, list(spec.generate.input_files())))
    device, settings, decisions = decide_offload(spec, ctx)

    stages = _Stages(ctx)

    def on_event(event: PipelineEvent) -> None:
        if event.kind == "stage_start":
            stages.start(event.stage)
        elif event.kind == "stage_end":
            stages.end()
        elif event.kind == "step":
            ctx.progress(event.data["step"], event.data["steps"])
        elif event.kind in _EVENT_KINDS:
            ctx.event(_EVENT_KINDS[event.kind], event.message, data=event.data)

    def on_rank_event(rank: int, event: PipelineEvent) -> None:
        """Rank 0 drives the job's stages and progress; the other ranks' events are recorded tagged by rank."""
        if rank == 0:
            on_event(event)
        elif event.kind in _EVENT_KINDS or event.kind == "stage_end":
            kind = _EVENT_KINDS.get(event.kind, RANK_STAGE)
            ctx.event(kind, f"rank {rank}: {event.message}", data={**event.data, "rank": rank, "stage": event.stage})

    out_path = ctx.artifact_path("video", ".mp4")
    common = dict(dtype=parse_dtype(spec.dtype), mode=spec.mode, offload=settings, decided=decisions,
                  sequential_components=getattr(spec, "sequential_components", None), sample_interval=SAMPLE_INTERVAL,
                  roots=ctx.config.model_roots)
    try:
        # The settings are already resolved for `device`: the pipeline takes them and their decisions as they are.
        if params.parallel > 1:
            from models.parallel import run_parallel_generate

            result = run_parallel_generate(
                spec.model, params, out_path, device=spec.device, on_event=on_rank_event,
                on_sample=lambda rank, stage, sample: ctx.record(sample, stage=stage, rank=rank), **common)
        else:
            result = run_generate(
                spec.model, params, out_path, device=spec.device, device_info=device, on_event=on_event,
                on_sample=lambda stage, sample: ctx.record(sample, stage=stage), probe=ctx.probe, **common)
    except BaseException:
        stages.abort()
        raise
    stages.end()
    ctx.add_artifact(out_path)
    metrics = result.to_dict()
    metrics["out_path"] = out_path.name
    metrics["peak_footprint"] = max(result.stage_peaks.values(), default=0)
    return metrics
