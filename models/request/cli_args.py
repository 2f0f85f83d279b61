"""The command-line arguments of a generate request's workflow, input files and VAE / DiT knobs.

Shared by `python -m models generate` and `python -m jobs submit generate`, and
free of torch so that building a parser stays cheap.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..inputs.clips import CLIP_FORMATS, MIN_CLIP_FRAMES
from ..speed.levers import ATTENTION_BACKENDS, STEP_CACHES
from ..quantization.check import FP8_COMPUTE
from ..lora.inputs import LoraInput, parse_lora_arg
from ..run.workflows import WORKFLOWS

QUANTIZATIONS = ("int8", "fp8", FP8_COMPUTE)
"""DiT quantizations (torchao): weight-only int8 on CPU and CUDA, weight-only fp8 and fp8 compute (fp8 activations
too) on CUDA compute capability 8.9+."""
QKV_LAYOUTS = ("stacked", "interleaved")
"""How a single-file DiT's fused `qkv_proj` orders its rows: `[q; k; v]` (every published file, the default) or
per head `[q k v]` (a file merged by hand from the MiniMaxAI shards); the file cannot tell."""
VAE_DTYPES = ("bf16", "fp32")
"""Video VAE precision: the run's bfloat16 (diffusers' `load_components(dtype=bf16)`) or the checkpoint's fp32."""


def add_workflow_arguments(parser: argparse.ArgumentParser) -> None:
    """The workflow, its input files and the VAE / DiT knobs, shared by `models generate` and `jobs submit generate`."""
    parser.add_argument("--workflow", choices=WORKFLOWS, help="default: picked from the input files given")
    parser.add_argument("--image", metavar="FILE", help="fl2va: the frame the clip starts from (PNG, JPEG, WebP)")
    parser.add_argument("--last-image", metavar="FILE", help="fl2va: the frame the clip ends on")
    parser.add_argument("--ref-image", metavar="FILE", help="ref2va: a reference image (subject, style, scene)")
    parser.add_argument("--ref-video", metavar="FILE",
                        help=f"ref2va: a reference clip, {' or '.join(f.upper() for f in CLIP_FORMATS)} (motion,"
                             f" camera, and its soundtrack), at least {MIN_CLIP_FRAMES} frames at 24 fps; after"
                             " --ref-image when both are given")
    parser.add_argument("--vae-tiling", action=argparse.BooleanOptionalAction, default=None,
                        help="decode on the VAE's 256 px tiles (default: on; off is noisier and risky at high res)")
    parser.add_argument("--vae-dtype", choices=VAE_DTYPES, help="video VAE precision (default: bf16)")
    parser.add_argument("--quantize", choices=QUANTIZATIONS,
                        help="DiT quantization (torchao): int8 / fp8 weight-only (memory), fp8-compute (fp8 activations"
                             " and weights: speed; lossy, CUDA 8.9+)")
    parser.add_argument("--attention", choices=ATTENTION_BACKENDS,
                        help="the DiT's attention backend (default: native; lossless but sage)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="regional compile of the DiT's blocks (lossless; the first calls compile)")
    parser.add_argument("--vae-compile", action=argparse.BooleanOptionalAction, default=None,
                        help="compile the video VAE decoder's blocks (lossless; its first call compiles, timed as the"
                             " stage decode.compile)")
    parser.add_argument("--step-cache", choices=STEP_CACHES,
                        help="reuse DiT work across steps (lossy; first-block and mag are unavailable for H3)")
    parser.add_argument("--parallel", type=int, metavar="N",
                        help="run this one generate on N local GPUs (one rank each): the DiT on every rank, its"
                             " sequence split by diffusers' context parallelism; text encoder and VAEs on rank 0")
    parser.add_argument("--preset", metavar="NAME",
                        help="a few-step preset of models/request/presets.json: its steps, shift and LoRA (by file name, under"
                             " the model roots) where the command gives none")
    parser.add_argument("--shift", type=float, metavar="S",
                        help="the video scheduler's sigma shift (default: a LoRA's stated one, else the scheduler"
                             " config's, 12 for H3); a few-step LoRA's card gives its own")
    parser.add_argument("--lora", dest="loras", action="append", type=_lora_type, metavar="FILE[:SCALE]",
                        help="a safetensors LoRA merged into the DiT as it loads, at SCALE (default 1.0); repeat to"
                             " stack them in order")
    parser.add_argument("--transformer", metavar="FILE",
                        help="a single-file DiT in the original layout (Comfy-Org's MiniMax H3 files), .safetensors,"
                             " or .gguf kept quantized (requirements-gguf.txt); the model folder (--model) supplies the"
                             " text encoder, VAEs, tokenizer, schedulers and the DiT's config")
    parser.add_argument("--qkv-layout", choices=QKV_LAYOUTS,
                        help="row order of that file's fused qkv: stacked [q; k; v] (every published file, the"
                             " default) or interleaved per head (a file merged by hand); the file cannot tell")


def _lora_type(text: str) -> LoraInput:
    try:
        return parse_lora_arg(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


WORKFLOW_FIELDS = ("workflow", "image", "last_image", "ref_image", "ref_video", "vae_tiling", "vae_dtype", "quantize",
                   "attention", "compile", "step_cache", "vae_compile", "shift", "loras", "transformer", "qkv_layout",
                   "parallel")
"""GenerateParams fields that `add_workflow_arguments` adds, by their argparse names."""


PLANS = ("fastest",)
"""The plans `--plan` takes (`models.speed.plan`)."""


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """`--plan fastest` and `--allow-lossy`, shared by `models generate`, `models forecast` and `jobs submit generate`."""
    parser.add_argument("--plan", choices=PLANS,
                        help="pick residency, weight precision and speed levers: the fastest candidate that fits (by"
                             " this machine's history; without it, a stated order of preference)")
    parser.add_argument("--allow-lossy", action="store_true",
                        help="with --plan: lossy levers may be picked too (quantized weights, fp8 compute, sage, a"
                             " step cache); their quality cost cannot be judged on random weights")


def workflow_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The GenerateParams fields of `add_workflow_arguments` that were given."""
    fields = {name: getattr(args, name) for name in WORKFLOW_FIELDS if getattr(args, name) is not None}
    if "loras" in fields:
        fields["loras"] = tuple(fields["loras"])
    return fields


def lora_roots(model_dir: str, fields: dict[str, Any]) -> list[str] | None:
    """The folders a command-line run may read from: the model, each LoRA and the single-file DiT named on the
    command line (a job reads only under the configured model roots); None when neither is given (the model's
    own folder, and a single file's)."""
    files = [lora.file for lora in fields.get("loras") or ()]
    if not files:
        return None
    import os

    files += [fields["transformer"]] if fields.get("transformer") else []
    return [model_dir, *dict.fromkeys(os.path.dirname(os.path.abspath(f)) for f in files)]
