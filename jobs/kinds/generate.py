"""The `generate` job: MiniMax H3 (t2va, fl2va or ref2va) into an MP4 artifact, recording memory per stage.

Input images are read from the job's own copies (`jobs.input_copies`), never from the path the user gave.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from core.echo import echo
from jobs.context import JobContext
from jobs.errors import Problems
from jobs.kinds import JobKind, job_kind
from jobs.probe import decide_offload
from models.request.params import INDEX_FILE, GenerateParams, GenerateParamsError, ModelSpec, validate_params
from storage.config import Config, ModelPathError, resolve_model_path

if TYPE_CHECKING:
    from jobs.admission import KindForecast
    from jobs.spec import JobSpec  # annotations only: listing kinds stays torch-free
    from machine.device import DeviceInfo

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


def run_generate_job(spec: JobSpec, ctx: JobContext) -> dict[str, Any]:
    """Probe the device and resolve the offload policy once (decisions become events), generate
    `spec.options.generate` into the job's `video.mp4`, mirror the pipeline's stages (one per block, one per
    component load), denoising steps (as progress), placements, loads and releases into the job,
    sample memory on a timer tagged with the stage, and return the pipeline's result: stage timings
    (`stage_seconds`), per-stage peak footprint (`stage_peaks`), the offload settings and the diffusers
    mechanism each component got (`placements`), and each component's load report (`loads`)."""
    from jobs.input_copies import input_copies
    from loader.dtypes import parse_dtype
    from models.run.pipeline import PipelineEvent, run_generate

    options: GenerateJobOptions = spec.options
    if options.generate is None:
        raise ValueError("a generate job needs generate parameters")
    params = replace(options.generate, **input_copies(ctx.data_dir, ctx.job_id, list(options.generate.input_files())))
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
                  sequential_components=options.sequential_components, sample_interval=SAMPLE_INTERVAL,
                  roots=ctx.config.model_roots)
    try:
        # The settings are already resolved for `device`: the pipeline takes them and their decisions as they are.
        if params.parallel > 1:
            from models.parallel.launch import run_parallel_generate

            result = run_parallel_generate(
                spec.model, params, out_path, device=spec.device, on_event=on_rank_event,
                on_sample=lambda rank, stage, sample: ctx.record(sample, stage=stage, rank=rank),
                launcher=_rank_launcher(ctx, options.ray_placement), **common)
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


def _rank_launcher(ctx: JobContext, prefer: str | None):
    """Where a parallel generate's ranks run: placed by Ray when the job runs on a Ray cluster that said so
    (`jobs.backends.ray_ranks`; where each rank went, and any wait for the GPUs, become `ray` events), else None (this machine's,
    `models.parallel.launch.LocalRanks`). `prefer`: the placement the job was forecast with."""
    import os

    from jobs.backends.ray_ranks import ENV_RANKS, RayRanks

    if os.environ.get(ENV_RANKS) != "1":
        return None
    return RayRanks(on_note=lambda line, data: ctx.event("ray", line, data=data), prefer=prefer)


@dataclass(frozen=True)
class GenerateJobOptions:
    """A generate job's own fields."""

    generate: GenerateParams | None = None
    """The clip: prompt, workflow and its inputs, size, steps, levers, LoRAs (set for every queued generate)."""
    sequential_components: bool | None = None
    """Load, run and free one component at a time; None leaves it to the policy's default."""
    plan: str | None = None
    """`fastest` picks residency, weight precision and speed levers at submit (`models.speed.plan`)."""
    plan_lossy: bool = False
    """With `plan`: lossy levers (quantized weights, fp8 compute, SageAttention, a step cache) may be picked."""
    planned: dict[str, Any] | None = None
    """What the plan considered, chose and why (`models.speed.plan.Plan.to_dict`), set at submit."""
    preset: str | None = None
    """A few-step preset (`models.request.presets`) whose steps, shift and LoRA filled what the request left unset."""
    schedule: dict[str, str] | None = None
    """Where the clip's steps and shift came from: `given`, `LoRA <file name>` (its metadata states them) or
    `checkpoint` (the scheduler config's), set at submit (`models.request.params.stated_schedule`)."""
    ray_placement: str | None = None
    """Under Ray, how the cluster would place the `--parallel` ranks, asked of it at submit
    (`jobs.backends.ray_ranks.placement`): `STRICT_SPREAD` (one per node: the forecast and the walls count one rank
    per host) or `STRICT_PACK`; None for local ranks, or a cluster that did not answer (counted as one host)."""


@job_kind("generate")
class GenerateKind(JobKind):
    """MiniMax H3 (t2va, fl2va or ref2va) into an MP4."""

    summary = "generate a clip with MiniMax H3 (t2va, fl2va or ref2va)"
    label = "load + generate"
    example = 'python -m jobs submit generate --model data/models/demo --prompt "a fox" --steps 4'
    options = GenerateJobOptions
    reads_checkpoint = True
    run = staticmethod(run_generate_job)

    @classmethod
    def read(cls, stored: Mapping[str, Any]) -> GenerateJobOptions:
        options = super().read(stored)
        if isinstance(options.generate, Mapping):
            options = replace(options, generate=GenerateParams(**options.generate))
        return options

    @classmethod
    def check(cls, raw: Mapping[str, Any], spec: Mapping[str, Any], config: Config,
              problems: Problems) -> GenerateJobOptions:
        """The clip's parameters (types here, ranges by the model's own rules; a single-file DiT and each LoRA
        resolved under the model roots), the plan, the levers the device can run, and a checkpoint a generate can
        run (an H3 model folder whose DiT is not packed)."""
        preset = raw.get("preset")
        params, schedule = _generate(raw.get("generate"), spec["model"], config, problems, preset)
        sequential, lossy = raw.get("sequential_components"), raw.get("plan_lossy", False)
        for name, value in (("sequential_components", sequential), ("plan_lossy", lossy)):
            if value is not None and not isinstance(value, bool):
                problems.add(name, f"must be true, false or unset (the policy default), got {echo(value)}")
        options = GenerateJobOptions(generate=params, sequential_components=sequential if isinstance(sequential, bool)
                                  else None, plan=_plan(raw.get("plan"), problems), plan_lossy=lossy is True,
                                  preset=preset if isinstance(preset, str) else None, schedule=schedule,
                                  ray_placement=_ray_placement(params, spec["device"], config.ray_address, problems))
        _check_levers(params, spec["device"], spec["model"], problems, config.ray_address)
        _check_generate_checkpoint(spec["model"], config, problems)
        return options

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        from models.request.cli_args import add_plan_arguments, add_workflow_arguments

        parser.add_argument("--prompt", required=True, help="what the clip shows")
        for name, default in (("frames", "124, 5 s at 24 fps"), ("height", "the checkpoint's canvas"),
                              ("width", "the checkpoint's canvas"),
                              ("steps", "the scheduler config's, else 50; N steps make N - 1 DiT calls"), ("seed", "0")):
            parser.add_argument(f"--{name}", metavar="N", help=f"(default: {default})")
        parser.add_argument("--no-audio", action="store_true", help="skip the stereo soundtrack")
        add_workflow_arguments(parser)
        add_plan_arguments(parser)
        parser.add_argument("--sequential-components", action=argparse.BooleanOptionalAction,
                            help="load, run and free one component at a time (default: the policy's)")

    @classmethod
    def arguments(cls, args: argparse.Namespace) -> dict[str, Any]:
        from models.request.cli_args import workflow_fields

        params: dict[str, Any] = {"prompt": args.prompt, "audio": not args.no_audio}
        for name in ("frames", "height", "width", "steps", "seed"):
            if getattr(args, name) is not None:
                params[name] = getattr(args, name)
        raw = {"sequential_components": args.sequential_components, "generate": params | workflow_fields(args)}
        raw |= {"preset": args.preset} if args.preset else {}
        return raw | ({"plan": args.plan, "plan_lossy": args.allow_lossy} if args.plan else {})

    @classmethod
    def prepare(cls, spec: JobSpec, config: Config, db, **kwargs) -> JobSpec:
        """With a plan, the spec as its chosen candidate runs it (`plan_job`); a plan that finds nothing that fits
        is refused with its line unless forced."""
        from core.errors import DrainboardError
        from jobs.admission import JobRefused

        if spec.options.plan is None:
            return spec
        try:
            spec, plan = plan_job(spec, config, db, **kwargs)
        except (DrainboardError, ValueError, OSError):
            return spec  # a checkpoint the forecast cannot read: the job itself reports it, naming the file
        if plan.choice is None and not spec.forced:
            from jobs.admission import remedy

            first = plan.candidates[0] if plan.candidates else None
            raise JobRefused(plan.why + (f": {remedy(first.wall_name, first.need, cli=True)}" if first else ""))
        return spec

    @classmethod
    def forecast(cls, spec: JobSpec, device: DeviceInfo, db) -> KindForecast:
        """Per stage of the workflow (`models.forecast_generate`, under the offload policy's answer), with the
        seconds this machine's history says each takes."""
        from jobs.admission import KindForecast
        from jobs.history import stage_records
        from models.forecast.eta import device_key, estimate, stage_work
        from models.speed.levers import lever_key
        from models.lora.inputs import lora_key
        from models.speed.plan import stage_needs

        forecast = generate_forecast(spec, device)
        work = stage_work(forecast)
        records = stage_records(db) if db is not None else []
        values = spec.options.generate.to_dict()
        eta = [e.to_dict() for e in estimate(work, records, device_key(device.kind, device.name), lever_key(values),
                                             lora_key(values))]
        return KindForecast(stage_needs(forecast), forecast.process_host_bytes, forecast.process_device_bytes,
                            eta, work, list(forecast.not_counted))

    @classmethod
    def resolve_offload(cls, spec: JobSpec, device: DeviceInfo):
        """Fit-aware against the forecast on a discrete GPU (`models.forecast.resolve_for_generate`)."""
        from loader.dtypes import parse_dtype
        from models.forecast import resolve_for_generate

        if spec.options.generate is None:
            return super().resolve_offload(spec, device)
        dtype = parse_dtype(spec.dtype) if spec.dtype else None
        return resolve_for_generate(spec.model, spec.options.generate, spec.offload, device, user_set=spec.offload_set,
                                    dtype_bytes=dtype.itemsize if dtype else 2,
                                    sequential_components=spec.options.sequential_components)

    @classmethod
    def ranks(cls, spec: JobSpec) -> int:
        """`--parallel N`: N ranks, each a process that starts as the child does."""
        return spec.options.generate.parallel if spec.options.generate is not None else 1

    @classmethod
    def ranks_per_host(cls, spec: JobSpec) -> int:
        """One when Ray spreads the ranks one per node, else all of them."""
        return 1 if spec.options.ray_placement == "STRICT_SPREAD" else cls.ranks(spec)

    @classmethod
    def input_files(cls, spec: JobSpec) -> dict[str, str]:
        return spec.options.generate.input_files() if spec.options.generate is not None else {}


def generate_forecast(spec: JobSpec, info: DeviceInfo):
    """The forecast of a generate spec under the offload policy's answer for it."""
    from loader.dtypes import parse_dtype
    from models.forecast import forecast_generate, resolve_for_generate

    options: GenerateJobOptions = spec.options
    dtype = parse_dtype(spec.dtype) if spec.dtype else None
    dtype_bytes = dtype.itemsize if dtype is not None else 2
    settings, _ = resolve_for_generate(spec.model, options.generate, spec.offload, info, user_set=spec.offload_set,
                                       dtype_bytes=dtype_bytes, sequential_components=options.sequential_components)
    return forecast_generate(spec.model, options.generate, device_info=info, settings=settings,
                             dtype_bytes=dtype_bytes, sequential_components=options.sequential_components,
                             resolved=True, ranks_per_host=GenerateKind.ranks_per_host(spec))


def plan_job(spec: JobSpec, config: Config, db=None, *, probe=None, available: int | None = None,
             total: int | None = None):
    """`spec`'s `--plan fastest`: every candidate (`models.speed.plan`) forecast against the job's own walls and timed
    from this machine's history. Returns (the spec as the chosen candidate runs it, with the plan recorded in
    `planned`; the Plan). With no candidate that fits, the spec is the request as given."""
    from jobs.admission import learned_process, processes, wall_checks
    from jobs.guard import read_meminfo
    from jobs.history import stage_records
    from machine.device import probe_device
    from models.forecast.eta import device_key
    from models.speed.plan import plan_fastest, planned, stage_needs, startup_words
    from models.quantization.check import cuda_capability

    info = (probe or probe_device)(spec.device)
    options: GenerateJobOptions = spec.options
    if available is None or total is None:
        reading = read_meminfo()
        available = reading.available if available is None else available
        total = reading.total if total is None else total

    def forecast_for(params, sequential: bool):
        return generate_forecast(replace(spec, options=replace(options, generate=params,
                                                               sequential_components=sequential)), info)

    process = learned_process("generate", device_key(info.kind, info.name), db)

    def check(forecast):
        return wall_checks(spec, config, info, stage_needs(forecast),
                           (process.startup_bytes or 0) * processes(spec) + forecast.process_host_bytes,
                           forecast.process_device_bytes, available, total)

    plan = plan_fastest(options.generate, device=spec.device, capability=cuda_capability(info.kind, info.index),
                        device_key=device_key(info.kind, info.name), forecast_for=forecast_for, check=check,
                        records=stage_records(db) if db is not None else [],
                        startup=startup_words(process.startup_bytes, process.basis), lossy=options.plan_lossy,
                        sequential=options.sequential_components)
    if plan.choice is None:
        return replace(spec, options=replace(options, planned=plan.to_dict())), plan
    params, sequential = planned(options.generate, plan)
    return replace(spec, options=replace(options, generate=params, sequential_components=sequential,
                                         planned=plan.to_dict())), plan


def _plan(value: Any, problems: Problems) -> str | None:
    """`plan`: unset, or one of `models.request.cli_args.PLANS`."""
    from models.request.cli_args import PLANS

    if value is not None and value not in PLANS:
        problems.add("plan", f"unknown plan {echo(value)}; known: {', '.join(PLANS)}")
    return value


def _check_levers(params: GenerateParams | None, device: str | None, model: str | None, problems: Problems,
                  ray_address: str | None = None) -> None:
    """A lever the job's device cannot run (a CUDA-only attention backend on a CPU, fp8 compute or an fp8 / int8
    DiT without torchao or below its compute capability, more ranks than GPUs: this machine's, or under Ray the
    cluster's nodes') is refused here, as the Run page warns, not when the child loads the transformer."""
    if params is None or device is None or problems.has("device", "gpus"):
        return  # the device itself is refused already (its probe failed): that is the line to show
    from machine.device import parse_device_spec
    from models.speed.levers import lever_problems
    from models.quantization.check import cuda_capability

    capability = cuda_capability(*parse_device_spec(device))
    for name, problem in lever_problems(params.to_dict(), device, capability).items():
        problems.add(f"generate.{name}", problem)
    if isinstance(params.parallel, int) and params.parallel > 1:
        from models.parallel.launch import parallel_problem

        # Under Ray the cluster's GPUs count (`_ray_placement`), not this machine's.
        local = None if ray_address is not None and device.startswith("cuda") else parallel_problem(device,
                                                                                                   params.parallel)
        problem = local or _split_problem(model, params)
        if problem is not None:
            problems.add("generate.parallel", problem)


def _ray_placement(params: GenerateParams | None, device: str | None, ray_address: str | None,
                   problems: Problems) -> str | None:
    """Under Ray, how the cluster would place a parallel generate's ranks (`GenerateJobOptions.ray_placement`); a
    cluster that cannot place them is refused in one line naming what its nodes hold."""
    if ray_address is None or params is None or device is None or not isinstance(params.parallel, int) \
            or params.parallel < 2 or problems.has("device", "gpus"):
        return None
    from jobs.backends.ray_ranks import cluster_placement

    strategy, problem = cluster_placement(ray_address, device.split(":")[0], params.parallel)
    if problem is not None:
        problems.add("generate.parallel", problem)
    return strategy


def _split_problem(model: str | None, params: GenerateParams) -> str | None:
    """Whether the packed sequence divides by the ranks (diffusers' context parallelism splits it evenly); a model
    the forecast cannot read is left to the checkpoint's own checks to name."""
    from core.errors import DrainboardError
    from models.forecast import packed_rows
    from models.request.params import split_problem

    try:
        return None if model is None else split_problem(packed_rows(model, params), params.parallel)
    except (DrainboardError, OSError, ValueError, KeyError):
        return None


def _check_generate_checkpoint(model: str | None, config: Config, problems: Problems) -> None:
    """A generate's checkpoint must be an H3 model folder whose DiT is not packed (`models.checkpoint.formats`), never a
    skeleton; one the loader refuses is named once already, under `model`."""
    if model is None or problems.has("model"):
        return
    from loader.checkpoint import checkpoint_problems
    from models.checkpoint.single_file import generate_checkpoint_problem

    index, found = checkpoint_problems(model, config.model_roots)
    if index is not None and not found:
        problem = generate_checkpoint_problem(index)
        if problem is not None:
            problems.add("model", problem)


def _generate(raw: Any, model: str | None, config: Config, problems: Problems,
              preset: Any = None) -> tuple[GenerateParams | None, dict[str, str] | None]:
    """Generate parameters and where their steps and shift came from: types here, ranges by the model's own
    rules; a single-file DiT (`transformer`) resolved under the model roots, as the model is; a preset's steps,
    shift and LoRA (found under the model roots) where unset (`models.request.presets`); unset steps and shift taken from
    a LoRA whose metadata states them (`models.request.params.stated_schedule`)."""
    params = _generate_params(raw or {}, problems)
    if params is not None and preset is not None:
        from models.request.presets import PresetError, with_preset

        try:
            if not isinstance(preset, str):
                raise PresetError(f"must be a preset name, got {echo(preset)}")
            params = with_preset(params, preset, config.model_roots)
        except PresetError as e:
            problems.add("preset", str(e))
            return None, None
    if params is not None and params.transformer is not None:
        try:
            params = replace(params, transformer=str(resolve_model_path(params.transformer, config.model_roots)))
        except ModelPathError as e:
            problems.add("generate.transformer", str(e))
            return None, None
    if params is None or model is None:
        return params, None
    from models.request.params import GIVEN, stated_schedule

    _check_against_model(params, model, problems)
    params, facts = _checked_loras(params, model, config, problems)
    params, schedule = stated_schedule(params, facts)
    if any(schedule[name] != GIVEN and getattr(params, name) is not None for name in schedule):
        _check_against_model(params, model, problems)  # a LoRA's stated steps or shift
    return params, schedule


def _checked_loras(params: GenerateParams, model: str, config: Config, problems: Problems) -> tuple[GenerateParams, list]:
    """Each LoRA resolved under a model root and checked against the model (`models.lora.inputs.inspect_lora`),
    recorded with its content hash and partition, with what its header says (`LoraFacts`); a bad one is refused
    naming the file."""
    if not params.loras:
        return params, []
    from models.lora.inputs import LoraError, inspect_lora

    facts = []
    for i, lora in enumerate(params.loras):
        try:
            resolve_model_path(lora.file, config.model_roots)
            facts.append(inspect_lora(lora, model, params.resolved_workflow, config.model_roots))
        except ModelPathError as e:
            problems.add(f"generate.loras[{i}]", f"LoRA {echo(lora.file)}: {e}")
        except LoraError as e:
            problems.add(f"generate.loras[{i}]", str(e))
    if len(facts) != len(params.loras):
        return params, facts
    return replace(params, loras=tuple(f.lora for f in facts)), facts


def _generate_params(raw: Mapping[str, Any], problems: Problems) -> GenerateParams | None:
    """Types only (names, ints, a float, a bool, strings): the ranges are the model's to judge."""
    names = {f.name for f in fields(GenerateParams)}
    for name in sorted(set(raw) - names):
        problems.add(f"generate.{name}", f"unknown parameter; known: {', '.join(sorted(names))}")
    unset = {f.name for f in fields(GenerateParams) if f.default is None}  # a stored spec says None for these
    values = {k: v for k, v in raw.items() if k in names and not (v is None and k in unset)}
    ok = True
    if "loras" in values:
        try:
            values["loras"] = GenerateParams(prompt="", loras=values["loras"]).loras
        except GenerateParamsError as e:
            problems.add("generate.loras", e.problems["loras"])
            ok = False
    for name in ("prompt", "negative_prompt", "transformer", "qkv_layout"):
        if name in values:
            problem = _text_problem(values[name])
            if problem is not None:
                problems.add(f"generate.{name}", problem)
                ok = False
    if "prompt" not in values:
        problems.add("generate.prompt", "a prompt is required")
        ok = False
    for name in ("frames", "height", "width", "steps", "seed", "fps", "parallel"):
        if name in values:
            value = values[name]
            try:
                if isinstance(value, bool) or isinstance(value, float):
                    raise ValueError
                values[name] = int(str(value))
            except ValueError:
                problems.add(f"generate.{name}", f"must be an integer, got {echo(value)}")
                ok = False
    for name in ("guidance_scale", "shift"):
        if name in values:
            try:
                if isinstance(values[name], bool):
                    raise ValueError
                values[name] = float(values[name])
            except (TypeError, ValueError):
                problems.add(f"generate.{name}", f"must be a number, got {echo(values[name])}")
                ok = False
    for name in ("audio", "compile", "vae_compile"):
        if name in values and not isinstance(values[name], bool):
            problems.add(f"generate.{name}", f"must be true or false, got {echo(values[name])}")
            ok = False
    return GenerateParams(**values) if ok else None


def _check_against_model(params: GenerateParams, model: str, problems: Problems) -> None:
    """The models package's own validation (config.json and index headers only, no weights),
    each problem filed under `generate.<field>`, or under `model` when the folder is no generate model. A
    lone file or a folder without the pipeline's index is left to `_check_checkpoint`, which names what it is."""
    if not (Path(model) / INDEX_FILE).is_file():
        return
    try:
        validate_params(params, ModelSpec.read(model))
    except GenerateParamsError as e:
        for name, message in sorted(e.problems.items()):
            problems.add("model" if name == "model" else f"generate.{name}", message)


def _text_problem(value: Any) -> str | None:
    """Why `value` is not storable text: not a string, or not valid UTF-8 (a command line's stray byte
    arrives as a lone surrogate, U+DC80..U+DCFF, which neither SQLite nor the tokenizer can encode)."""
    if not isinstance(value, str):
        return f"must be text, got {echo(value)}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        char = ord(value[e.start])
        what = f"byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else f"character U+{char:04X}"
        return f"is not valid UTF-8 text: {what} at position {e.start}"
    return None
