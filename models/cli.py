"""`python -m models synth|generate`: write a synthetic MiniMax H3 checkpoint, or generate a clip.

With `--json` exactly one JSON object goes to stdout; progress goes to stderr.
Bad input exits 2 with `{"ok": false, "error": ..., "errors": [...]}`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

import torch

from loader.command_line import CliParser, run_cli, size_type
from loader.offload import OffloadSettings
from loader.placement import known_placements

from .params import GenerateParams
from .request_args import add_workflow_arguments, workflow_fields
from .pipeline import PipelineEvent, run_generate
from .profiles import PROFILES, get_profile
from .progress import ProgressBar

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _synth(args: argparse.Namespace) -> int:
    bar = None if args.dry_run else ProgressBar(1, f"synth {args.profile}", unit=" GB", scale=1e9)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done)

    from .h3synth import synth_h3

    report = synth_h3(
        args.out, get_profile(args.profile), dtype=_DTYPES[args.dtype], shard_bytes=args.shard_size,
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


def _generate(args: argparse.Namespace) -> int:
    params = GenerateParams(
        prompt=args.prompt, negative_prompt=args.negative_prompt, frames=args.frames, height=args.height,
        width=args.width, steps=args.steps, guidance_scale=args.guidance_scale, seed=args.seed, fps=args.fps,
        audio=not args.no_audio, **workflow_fields(args),
    )
    bar = ProgressBar(1, "denoising", unit=" steps")

    def on_event(event: PipelineEvent) -> None:
        if event.kind == "step":
            bar.total = event.data["steps"]
            bar.update(event.data["step"])
        elif event.kind in ("offload_decision", "load", "release", "note") or (
                event.kind in ("stage_end", "placement") and args.verbose):
            print(f"[{event.stage}] {event.message}", file=sys.stderr)

    offload = OffloadSettings(
        dit_layerwise_offload=args.offload, dit_cpu_offload=args.offload, text_encoder_cpu_offload=args.offload,
        image_encoder_cpu_offload=args.offload, vae_cpu_offload=args.offload, pin_cpu_memory=args.pin_cpu_memory,
    )
    result = run_generate(
        args.model_dir, params, args.out, device=args.device, dtype=_DTYPES[args.dtype] if args.dtype else None,
        mode=args.mode, offload=offload, sequential_components=args.sequential_components, on_event=on_event,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        total = sum(result.stage_seconds.values())
        print(f"wrote {result.out_path}: {result.frames} frames {result.width}x{result.height} @ {result.fps} fps"
              f"{' with audio' if result.audio else ''} in {total:.1f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(prog="python -m models", description="MiniMax H3 in Drainboard: synthetic checkpoints, generate")
    sub = parser.add_subparsers(dest="command", required=True)
    synth = sub.add_parser(
        "synth", help="write a random-weight MiniMax H3 checkpoint in the release's layout",
        epilog="example: python -m models synth /models/h3-demo --profile demo",
    )
    synth.add_argument("out", help="model folder to write")
    synth.add_argument("--profile", default="demo", choices=list(PROFILES), help="model size (default: demo)")
    synth.add_argument("--dtype", default="bf16", choices=list(_DTYPES), help="stored dtype (default: bf16)")
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
    gen.add_argument("--negative-prompt", default=defaults.negative_prompt, help="must stay empty for H3")
    gen.add_argument("--out", required=True, help="MP4 to write")
    gen.add_argument("--frames", type=int, default=defaults.frames, help="17n + 5 within 124..345 (default: 124)")
    gen.add_argument("--height", type=int, default=defaults.height,
                     help="multiple of 32 (default: the checkpoint's 16:9 canvas)")
    gen.add_argument("--width", type=int, default=defaults.width,
                     help="multiple of 32 (default: the checkpoint's 16:9 canvas)")
    gen.add_argument("--steps", type=int, default=defaults.steps,
                     help="num_inference_steps, >= 2 (default: the scheduler config's, else 50)")
    gen.add_argument("--guidance-scale", type=float, default=defaults.guidance_scale, help="must stay 1.0 for H3")
    gen.add_argument("--seed", type=int, default=defaults.seed)
    gen.add_argument("--fps", type=int, default=defaults.fps, help="must stay 24 for H3")
    gen.add_argument("--no-audio", action="store_true", help="skip decode.audio and leave out the audio track")
    add_workflow_arguments(gen)
    gen.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default: cpu)")
    gen.add_argument("--dtype", choices=list(_DTYPES), help="compute dtype (default: bf16, fp32 modules kept)")
    gen.add_argument("--mode", default="stream", choices=known_placements(), help="loader placement mode (default: stream)")
    gen.add_argument("--offload", action=argparse.BooleanOptionalAction, default=True,
                     help="request the offload flags (the policy still turns them off on unified memory)")
    gen.add_argument("--pin-cpu-memory", action=argparse.BooleanOptionalAction, default=True,
                     help="pin a layerwise-offloaded DiT's host copy up front (CUDA)")
    gen.add_argument("--sequential-components", action=argparse.BooleanOptionalAction, default=None,
                     help="load each component before its first block, release it after its last"
                          " (default: on for unified memory)")
    gen.add_argument("--verbose", action="store_true", help="print every stage and placement")
    gen.add_argument("--json", action="store_true", help="print the GenerateResult as one JSON object")
    gen.set_defaults(func=_generate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), argv)
