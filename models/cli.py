"""`python -m models synth|generate|forecast`: write a synthetic MiniMax H3 checkpoint, generate a clip, or
forecast a generate's memory and seconds per stage.

With `--json` exactly one JSON object goes to stdout; progress goes to stderr.
Bad input exits 2 with `{"ok": false, "error": ..., "errors": [...]}`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

import torch

from core.command_line import CliParser, dtype_type, run_cli, size_type
from core.echo import echo
from core.errors import DrainboardError
from core.sizes import format_size
from machine.offload_option import add_offload_option
from core.dtype_names import dtype_help
from machine.offload import OffloadSettings
from loader.placement import known_placements, modes_help
from loader.process import configure_process

from .request.params import GenerateParams
from .request.cli_args import add_plan_arguments, add_workflow_arguments, lora_roots, workflow_fields
from .run.pipeline import run_generate
from .synth.profiles import PROFILES, get_profile
from .progress import ProgressBar
from .run.results import PipelineEvent

EXAMPLES = """examples:
  python -m models synth data/models/h3-demo --profile demo
  python -m models generate data/models/h3-demo --prompt "a red fox in the snow" --out clip.mp4 --steps 4
"""


def _synth(args: argparse.Namespace) -> int:
    bar = None if args.dry_run else ProgressBar(1, f"synth {args.profile}", unit=" GB", scale=1e9)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done)

    from .synth.writer import synth_h3

    report = synth_h3(
        args.out, get_profile(args.profile), dtype=getattr(torch, args.dtype), shard_bytes=args.shard_size,
        seed=args.seed, components=args.components, dry_run=args.dry_run, on_bytes=None if bar is None else progress,
    )
    if bar is not None:
        bar.close()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        for c in report.components:
            print(f"{c.name}: {c.class_name}, {c.tensors} tensors, {c.parameters:,} parameters,"
                  f" {c.bytes / 2**30:.2f} GiB in {c.shards} shard(s)")
        print(("would write " if args.dry_run else "wrote ") + args.out)
    return 0


def _with_stated_schedule(model_dir: str, params: GenerateParams, preset: str | None = None) -> GenerateParams:
    """`params` with `preset`'s steps, shift and LoRA where unset (its LoRA looked for under the folder that holds
    the model), then unset steps and shift taken from a LoRA whose metadata states them (`stated_schedule`, said on
    stderr); the LoRAs' headers are read, not hashed (the run hashes them)."""
    if preset is not None:
        from .request.presets import with_preset

        params = with_preset(params, preset, [os.path.dirname(os.path.abspath(model_dir))])
    if not params.loras or (params.steps is not None and params.shift is not None):
        return params
    from .lora.inputs import inspect_lora
    from .request.params import stated_schedule

    roots = lora_roots(model_dir, {"loras": params.loras, "transformer": params.transformer})
    facts = [inspect_lora(lora, model_dir, params.resolved_workflow, roots, hash_file=False) for lora in params.loras]
    params, sources = stated_schedule(params, facts)
    for name, source in sources.items():
        if source.startswith("LoRA"):
            print(f"{name} {getattr(params, name):g}: stated by LoRA {echo(source[5:])}", file=sys.stderr)
    return params


def _generate(args: argparse.Namespace) -> int:
    configure_process(args.device)
    fields = workflow_fields(args)
    params = _with_stated_schedule(args.model_dir, GenerateParams(
        prompt=args.prompt, frames=args.frames, height=args.height, width=args.width, steps=args.steps,
        seed=args.seed, audio=not args.no_audio, **fields), args.preset)
    bar = ProgressBar(1, "denoising", unit=" steps")

    def on_event(event: PipelineEvent) -> None:
        if event.kind == "step":
            bar.total = event.data["steps"]
            bar.update(event.data["step"])
        elif event.kind in ("offload_decision", "load", "release", "note") or (
                event.kind in ("stage_end", "placement") and args.verbose):
            print(f"[{event.stage}] {event.message}", file=sys.stderr)

    offload = OffloadSettings(**args.offload)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    sequential = args.sequential_components
    if args.plan:
        from machine.device import probe_device

        from .request.params import ModelSpec, validate_params

        validate_params(params, ModelSpec.read(args.model_dir))
        records, processes = _read_history(args.history)
        try:
            params, sequential, _ = _planned(args, params, probe_device(args.device), offload,
                                             dtype.itemsize if dtype is not None else 2, records, processes)
        except ValueError as e:
            raise PlanInputError(str(e)) from None
    common = dict(dtype=dtype, mode=args.mode, offload=offload, sequential_components=sequential,
                  roots=lora_roots(args.model_dir, {"loras": params.loras, "transformer": params.transformer}))
    if params.parallel > 1:
        from .parallel.launch import run_parallel_generate

        def on_rank_event(rank: int, event: PipelineEvent) -> None:
            if rank == 0:
                on_event(event)
            elif event.kind in ("load", "release", "note") or (event.kind == "stage_end" and args.verbose):
                print(f"[rank {rank} {event.stage}] {event.message}", file=sys.stderr)

        result = run_parallel_generate(args.model_dir, params, args.out, device=args.device, on_event=on_rank_event,
                                       **common)
    else:
        result = run_generate(args.model_dir, params, args.out, device=args.device, on_event=on_event, **common)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        total = sum(result.stage_seconds.values())
        print(f"wrote {result.out_path}: {result.frames} frames {result.width}x{result.height} @ {result.fps} fps"
              f"{' with audio' if result.audio else ''} in {total:.1f} s")
    return 0


class PlanInputError(DrainboardError):
    """A model folder or history file a forecast or a plan cannot read."""


def _read_history(path: str | None) -> tuple[list, list]:
    """(stage records, process records) of `--history` FILE; ([], []) without one."""
    from .forecast.eta import StageRecord
    from .forecast.process_size import ProcessRecord

    records, processes = [], []
    if path:
        try:
            for r in json.loads(open(path).read()):
                if "ready_bytes" in r:
                    processes.append(ProcessRecord(**r))
                else:
                    records.append(StageRecord(**r))
        except (OSError, ValueError, TypeError) as e:
            raise PlanInputError(f"{path}: expected a JSON list of stage records (stage, seconds, work,"
                                 f" device, levers) and process records (kind, device, ready_bytes,"
                                 f" startup_bytes): {e}") from None
    return records, processes


def _planned(args: argparse.Namespace, params: GenerateParams, info, offload: OffloadSettings, dtype_bytes: int,
             records=(), processes=()):
    """`--plan`: the request as the chosen candidate runs it, its residency and the plan (printed on stderr); a
    plan with nothing that fits is its fit verdict, in one line. Its walls count the process start-up learned from
    `processes`, as a job's plan counts it."""
    from machine.memory import sample_memory

    from .forecast.eta import device_key
    from .forecast import forecast_generate, resolve_for_generate
    from .speed.plan import machine_check, plan_fastest, plan_lines, planned, startup_words
    from .forecast.process_size import estimate_process
    from .quantization.check import cuda_capability

    def forecast_for(candidate: GenerateParams, sequential: bool):
        settings, _ = resolve_for_generate(args.model_dir, candidate, offload, info, user_set=tuple(args.offload),
                                           dtype_bytes=dtype_bytes, sequential_components=sequential)
        return forecast_generate(args.model_dir, candidate, device_info=info, settings=settings,
                                 dtype_bytes=dtype_bytes, sequential_components=sequential, resolved=True)

    device = device_key(info.kind, info.name)
    process = estimate_process(processes, "generate", device)
    check = machine_check(info.kind, info.unified_memory, info.total_memory, info.name, sample_memory().mem_available,
                          process.startup_bytes or 0)
    plan = plan_fastest(params, device=info.spec, capability=cuda_capability(info.kind, info.index),
                        device_key=device, forecast_for=forecast_for, check=check, records=records,
                        startup=startup_words(process.startup_bytes, process.basis), lossy=args.allow_lossy,
                        sequential=args.sequential_components)
    for line in plan_lines(plan.to_dict()):
        print(line, file=sys.stderr)
    if plan.choice is None:
        raise DrainboardError(plan.why)
    chosen, sequential = planned(params, plan)
    return chosen, sequential, plan


def _forecast(args: argparse.Namespace) -> int:
    from machine.device import probe_device

    from .forecast.eta import NO_HISTORY, device_key, estimate, stage_work, total_seconds
    from .speed.levers import lever_key
    from .lora.inputs import lora_key
    from .forecast import forecast_generate, resolve_for_generate
    from .request.params import ModelSpec, validate_params
    from .forecast.process_size import estimate_process, job_peak

    params = _with_stated_schedule(args.model_dir, GenerateParams(
        prompt=args.prompt, frames=args.frames, height=args.height, width=args.width, steps=args.steps,
        seed=args.seed, audio=not args.no_audio, **workflow_fields(args)), args.preset)
    validate_params(params, ModelSpec.read(args.model_dir))
    info = probe_device(args.device)
    offload = OffloadSettings(**args.offload)
    dtype_bytes = getattr(torch, args.dtype).itemsize
    records, processes = _read_history(args.history)
    sequential, plan = args.sequential_components, None
    try:
        if args.plan:
            params, sequential, plan = _planned(args, params, info, offload, dtype_bytes, records, processes)
        settings, decisions = resolve_for_generate(
            args.model_dir, params, offload, info, user_set=tuple(args.offload),
            dtype_bytes=dtype_bytes, sequential_components=sequential)
        forecast = forecast_generate(args.model_dir, params, device_info=info, settings=settings,
                                     dtype_bytes=dtype_bytes, sequential_components=sequential,
                                     resolved=True)
    except ValueError as e:
        raise PlanInputError(str(e)) from None
    device = device_key(info.kind, info.name)
    values = params.to_dict()
    etas = {e.stage: e for e in estimate(stage_work(forecast), records, device, lever_key(values), lora_key(values))}
    process = estimate_process(processes, "generate", device)
    stages = []
    for s in forecast.stages:
        eta = etas[s.stage]
        stages.append({"stage": s.stage, "host_bytes": s.host_bytes, "device_bytes": s.device_bytes,
                       "sum_bytes": s.total_bytes, "seconds": eta.seconds, "seconds_basis": eta.basis})
    loads = [etas[k].to_dict() for k in etas if k.startswith(("load.", "lora."))]  # a LoRA's prep is load work
    document = {
        "ok": True, "model": str(args.model_dir), "device": info.spec, "device_name": info.name,
        "unified_memory": info.unified_memory, "workflow": forecast.workflow, "quantize": params.quantize,
        "vae_dtype": params.vae_dtype, "width": forecast.width, "height": forecast.height,
        "frames": params.frames, "steps": forecast.steps, "text_tokens": forecast.text_tokens,
        "tokens": forecast.tokens, "sequential_components": forecast.sequential_components,
        "placements": forecast.placements, "decisions": [str(d) for d in decisions],
        "process": process.to_dict(), "process_host_bytes": forecast.process_host_bytes,
        "process_device_bytes": forecast.process_device_bytes, "stages": stages, "loads": loads,
        "peak_stage": forecast.peak_stage, "peak_bytes": forecast.predicted_peak_bytes,
        "lora_bytes": forecast.lora_bytes,
        "peak_with_process_bytes": job_peak(forecast, process),
        "total_seconds": total_seconds(etas.values()),
        "levers": forecast.levers, "lever_bytes": forecast.lever_bytes, "not_counted": forecast.not_counted,
        "plan": plan.to_dict() if plan is not None else None,
    }
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    print(f"{args.model_dir}: {forecast.workflow}, {forecast.width}x{forecast.height}, {params.frames} frames,"
          f" {forecast.steps} steps, {forecast.text_tokens} prompt tokens, {forecast.tokens} packed rows, on {info.name}")
    print(f"{'stage':<18}{'host GiB':>10}{'device GiB':>12}{'sum GiB':>10}{'seconds':>10}")
    for row in stages:
        seconds = f"{row['seconds']:.1f}" if row["seconds"] is not None else "-"
        print(f"{row['stage']:<18}{row['host_bytes'] / 2**30:10.2f}{row['device_bytes'] / 2**30:12.2f}"
              f"{row['sum_bytes'] / 2**30:10.2f}{seconds:>10}")
    total = document["total_seconds"]
    whole = document["peak_with_process_bytes"]
    print(f"peak {forecast.predicted_peak_bytes / 2**30:.2f} GiB at {forecast.peak_stage} above the process"
          f" ({f'{whole / 2**30:.2f} GiB with it, ' if whole is not None else ''}the process: {process.basis});"
          f" total "
          + (f"{total:.1f} s" if total is not None else f"unknown: {NO_HISTORY}"))
    for name, nbytes in forecast.lever_bytes.items():
        print(f"{name}: {format_size(nbytes)} counted in the stages that hold it")
    for line in forecast.not_counted:
        print(f"not counted: {line}")
    return 0


def add_history_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--history", metavar="FILE", help="JSON list of past stage records (stage, seconds, work,"
                                                          " device, and levers: the lever set) for the seconds"
                                                          " and process records (kind, device, ready_bytes,"
                                                          " startup_bytes) for the process; without it: no history")


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(prog="python -m models", description="MiniMax H3 in Drainboard: synthetic checkpoints, generate",
                       epilog=EXAMPLES)
    sub = parser.add_subparsers(dest="command", required=True)
    synth = sub.add_parser(
        "synth", help="write a random-weight MiniMax H3 checkpoint in the release's layout",
        epilog="example: python -m models synth /models/h3-demo --profile demo",
    )
    synth.add_argument("out", help="model folder to write")
    synth.add_argument("--profile", default="demo", choices=list(PROFILES), help="model size (default: demo)")
    synth.add_argument("--dtype", default="bfloat16", type=dtype_type, help=f"stored dtype: {dtype_help()} (default: bfloat16)")
    synth.add_argument("--shard-size", type=size_type(), default=None, metavar="SIZE",
                       help="max shard size, such as 5GB or 0.5GiB (default: the profile's: 5GB; 16MiB for demo,"
                            " 1MiB for tiny)")
    synth.add_argument("--seed", type=int, default=0, help="seed of every value (default: 0)")
    synth.add_argument("--components", nargs="+", metavar="NAME",
                       help="write only these weight folders (transformer, transformer_ref, text_encoder, vae,"
                            " audio_vae); the index lists what is on disk")
    synth.add_argument("--dry-run", action="store_true", help="only count tensors, parameters and bytes")
    synth.add_argument("--json", action="store_true", help="print one JSON object")
    synth.set_defaults(func=_synth)

    defaults = GenerateParams(prompt="")
    gen = sub.add_parser(
        "generate", help="generate a clip (MP4, H.264 + stereo AAC) with MiniMax H3 (t2va, fl2va or ref2va)",
        epilog="example: python -m models generate /models/h3-demo --prompt 'a red fox in the snow' --out clip.mp4",
    )
    gen.add_argument("model_dir", help="H3 model folder (modular_model_index.json and component folders)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--out", required=True, help="MP4 to write")
    gen.add_argument("--frames", type=int, default=defaults.frames, help="17n + 5 within 124..345 (default: 124)")
    gen.add_argument("--height", type=int, default=defaults.height,
                     help="multiple of 32 (default: the checkpoint's 16:9 canvas)")
    gen.add_argument("--width", type=int, default=defaults.width,
                     help="multiple of 32 (default: the checkpoint's 16:9 canvas)")
    gen.add_argument("--steps", type=int, default=defaults.steps,
                     help="num_inference_steps, >= 2 (default: the scheduler config's, else 50)")
    gen.add_argument("--seed", type=int, default=defaults.seed)
    gen.add_argument("--no-audio", action="store_true", help="skip decode.audio and leave out the audio track")
    add_workflow_arguments(gen)
    add_plan_arguments(gen)
    add_history_argument(gen)
    gen.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default: cpu)")
    gen.add_argument("--dtype", type=dtype_type, help=f"compute dtype: {dtype_help()} (default: bfloat16, fp32 modules kept)")
    gen.add_argument("--mode", default="stream", choices=known_placements(), metavar="MODE",
                     help=f"loader placement mode (default: stream): {modes_help()}")
    add_offload_option(gen)
    gen.add_argument("--sequential-components", action=argparse.BooleanOptionalAction, default=None,
                     help="load each component before its first block, release it after its last"
                          " (default: on for unified memory)")
    gen.add_argument("--verbose", action="store_true", help="print every stage and placement")
    gen.add_argument("--json", action="store_true", help="print the GenerateResult as one JSON object")
    gen.set_defaults(func=_generate)

    fc = sub.add_parser(
        "forecast", help="predict a generate's peak memory (host, device, sum) and seconds per stage, from"
                         " configs, safetensors headers and the tokenizer only",
        epilog="example: python -m models forecast /models/h3 --prompt 'a red fox in the snow' --frames 124"
               " --steps 50 --device cuda --json",
    )
    fc.add_argument("model_dir", help="H3 model folder (modular_model_index.json and component folders)")
    fc.add_argument("--prompt", required=True)
    fc.add_argument("--out", help="accepted as generate takes it; the forecast writes nothing")
    fc.add_argument("--frames", type=int, default=defaults.frames, help="17n + 5 within 124..345 (default: 124)")
    fc.add_argument("--height", type=int, default=defaults.height, help="(default: the checkpoint's 16:9 canvas)")
    fc.add_argument("--width", type=int, default=defaults.width, help="(default: the checkpoint's 16:9 canvas)")
    fc.add_argument("--steps", type=int, default=defaults.steps, help="num_inference_steps (default: the scheduler config's, else 50)")
    fc.add_argument("--seed", type=int, default=defaults.seed, help="accepted as generate takes it; no effect on memory")
    fc.add_argument("--no-audio", action="store_true", help="no decode.audio")
    add_workflow_arguments(fc)
    add_plan_arguments(fc)
    fc.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps; probed without a CUDA context")
    fc.add_argument("--dtype", default="bfloat16", type=dtype_type, help=f"compute dtype: {dtype_help()} (default: bfloat16)")
    fc.add_argument("--mode", default="stream", choices=known_placements(), metavar="MODE",
                    help="loader placement mode, as generate takes it (the stages' peaks do not depend on it)")
    add_offload_option(fc)
    fc.add_argument("--sequential-components", action=argparse.BooleanOptionalAction, default=None,
                    help="per-stage residency (default: on for unified memory)")
    fc.add_argument("--verbose", action="store_true", help="accepted as generate takes it")
    add_history_argument(fc)
    fc.add_argument("--json", action="store_true", help="print one JSON object")
    fc.set_defaults(func=_forecast)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    configure_process()
    return run_cli(build_parser(), argv)
