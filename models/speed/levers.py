"""The engine's speed levers: each one's options, whether it is lossless, and whether a device can run it.

The one home of these facts (torch-free at import): the CLIs, the job spec,
the Run page, the forecast, the ETA and the plan read them here. A lever is a
field of `GenerateParams`:

- `attention`: the DiT's attention backend, set with diffusers' public
  `set_attention_backend`; `native` is diffusers' default (torch SDPA, any kernel).
- `compile`: regional compile of the DiT's repeated blocks (`compile_repeated_blocks`);
  its first calls, which compile, are timed as their own stage, `COMPILE_STAGE`.
- `quantize`: `fp8-compute` is torchao's dynamic fp8 activations with fp8 weights
  (`models.quantization.quantize`); `int8` / `fp8` are weight-only (memory, not speed).
- `step_cache`: one of diffusers' cache hooks on the DiT, its calls wrapped in
  `cache_context` by our own denoise block (`models.run.stage_blocks`).
- `vae_compile`: compile of the video VAE decoder's repeated blocks (`compile_repeated_blocks`: H3's VAE
  declares its ViT decoder's transformer block); its first decoder call is timed as its own stage,
  `VAE_COMPILE_STAGE`. Tiling and decode precision, the VAE's other knobs, save memory, not time.

Lossless levers compute the same function (attention kernels, compiles); lossy ones
approximate it (quantized weights or activations, reused steps). Lossy levers are
opt-in, and on random weights their quality cost cannot be judged (Compare's A/B
judges it on real ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any

from ..quantization import check as quantize_check
from ..quantization.check import FP8_COMPUTE

ATTENTION_BACKENDS = ("native", "_native_cudnn", "_native_flash", "_native_efficient", "sage")
"""diffusers' `AttentionBackendName` values offered: torch SDPA (any kernel, then cuDNN's, flash's, memory-efficient's)
and SageAttention (its optional package)."""
CUDA_ONLY_BACKENDS = {"_native_cudnn": "cuDNN attention", "_native_efficient": "memory-efficient attention",
                      "sage": "SageAttention"}
"""Backends whose kernels exist on CUDA only (measured on this CPU: torch finds no viable SDPA kernel for the first
two; diffusers checks that sage's tensors are on CUDA)."""
BACKEND_CAPABILITY = {"_native_cudnn": (8, 0), "_native_flash": (8, 0), "sage": (8, 0)}
"""The least CUDA compute capability of torch's flash and cuDNN SDPA kernels and of SageAttention 2."""
STEP_CACHES = ("taylorseer", "first-block", "mag")
"""diffusers' step caches by our names: `TaylorSeerCacheConfig`, `FirstBlockCacheConfig`, `MagCacheConfig`."""
UNAVAILABLE_CACHES = {
    name: (f"the {name} cache is unavailable for MiniMax H3: it needs MiniMaxH3TransformerBlock in diffusers'"
           " transformer-block registry, which diffusers 0.42 does not fill and offers no public API to fill")
    for name in ("first-block", "mag")
}
"""Caches H3 cannot take: their hooks look blocks up in `TransformerBlockRegistry`, a private registry
(`diffusers.hooks._helpers`) with no H3 entry; registering one would be patching diffusers' internals."""
COMPILE_STAGE = "denoise.compile"
"""The stage of a compiled DiT's first `COMPILE_CALLS` calls: the compiles plus those steps, apart from the others."""
COMPILE_CALLS = 2
"""The DiT calls a regional compile compiles in. torch's dynamo specializes the first call's shapes and compiles again,
with the changed sizes dynamic, on the first call whose shapes differ; H3's `temb` has one row per distinct noise level,
one at the first step and two after, so its second call compiles too (`TORCH_LOGS=recompiles` shows it), and no later
one does. `dynamic=True` would not spare it: dynamo specializes a size of 1 whatever it is told."""
VAE_COMPILE_STAGE = "decode.compile"
"""The stage of a compiled VAE decoder's first call: the compile plus that one tile of one chunk, apart from the rest
of `decode.video` (every later call has the same shapes: the decoder's tiles and chunks are of one size)."""
INTERLUDES = {COMPILE_STAGE: "denoise.denoise", VAE_COMPILE_STAGE: "decode.video"}
"""Each stage a lever cuts out of another (`models.run.state.RunState.interlude`), by the stage it is cut from, which
goes on after it: a page telling the stages done from those to come reads it."""
STARTUP_STAGES = (COMPILE_STAGE, VAE_COMPILE_STAGE)
"""Stages a lever adds once per run, whatever its steps: their seconds are the lever's start-up cost, which a plan's
ranking counts (`models.speed.plan`)."""
DIT_LEVERS = ("attention", "compile", "quantize", "step_cache")
"""The lever fields that change the DiT (its calls, and its load, where it quantizes as placed)."""
LEVER_FIELDS = (*DIT_LEVERS, "vae_compile")
"""GenerateParams fields that are levers, in the order a lever set is named."""
STAGE_LEVERS = {**dict.fromkeys(("denoise.denoise", COMPILE_STAGE, "load.transformer", "load.transformer_ref"),
                                DIT_LEVERS),
                **dict.fromkeys(("decode.video", VAE_COMPILE_STAGE), ("vae_compile",))}
"""Stages whose seconds a lever set changes, each with the lever fields that change it: the ETA learns such a stage
per setting of those fields (`key_part`, `models.forecast.eta`), so a DiT lever never splits the decode's history."""


@dataclass(frozen=True)
class LeverOption:
    """One value of one lever."""

    field: str
    """The GenerateParams field."""
    value: Any
    """The value that turns it on."""
    lossless: bool
    """True when frames stay within the tolerance of the exact run; False when the lever approximates."""
    label: str
    """How a page names it."""


LEVER_OPTIONS = (
    LeverOption("attention", "_native_cudnn", True, "cuDNN attention"),
    LeverOption("attention", "_native_flash", True, "flash attention (torch)"),
    LeverOption("attention", "_native_efficient", True, "memory-efficient attention"),
    LeverOption("attention", "sage", False, "SageAttention (int8 QK)"),
    LeverOption("compile", True, True, "regional compile"),
    LeverOption("quantize", FP8_COMPUTE, False, "fp8 compute (fp8 activations and weights)"),
    LeverOption("quantize", "int8", False, "int8 (weight-only)"),
    LeverOption("quantize", "fp8", False, "fp8 (weight-only)"),
    LeverOption("step_cache", "taylorseer", False, "TaylorSeer step cache"),
    LeverOption("step_cache", "first-block", False, "first-block cache"),
    LeverOption("step_cache", "mag", False, "MagCache"),
    LeverOption("vae_compile", True, True, "VAE decoder compile"),
)
"""Every lever setting other than the default; whether it is lossless is said here and nowhere else."""
LOSSY_NOTE = ("Lossy levers approximate the model: with this checkpoint's random weights their quality cost cannot be "
              "judged; run the same prompt and seed with and without them on real weights and read Compare's A/B.")
"""Said wherever a lossy lever can be picked."""


def lever_option(field: str, value: Any) -> LeverOption | None:
    """The option `field` = `value` turns on, or None for a default (no lever)."""
    return next((o for o in LEVER_OPTIONS if o.field == field and o.value == value), None)


def levers_of(values: dict[str, Any]) -> list[LeverOption]:
    """The lever options a set of GenerateParams values turns on, in `LEVER_FIELDS` order."""
    found = (lever_option(name, values.get(name)) for name in LEVER_FIELDS)
    return [o for o in found if o is not None]


def lever_key(values: dict[str, Any]) -> str:
    """The lever set as history keys it: `attention=_native_cudnn+compile`, "" for none (the default engine)."""
    return "+".join(o.field if o.value is True else f"{o.field}={o.value}" for o in levers_of(values))


def key_part(key: str, fields: tuple[str, ...]) -> str:
    """Of lever key `key` (`lever_key`), the part naming `fields`: `attention=_native_cudnn+vae_compile` for the DiT's
    levers is `attention=_native_cudnn`."""
    return "+".join(part for part in key.split("+") if part and part.partition("=")[0] in fields)


def is_lossless(values: dict[str, Any]) -> bool:
    return all(o.lossless for o in levers_of(values))


def sage_installed() -> bool:
    return find_spec("sageattention") is not None


def triton_installed() -> bool:
    return find_spec("triton") is not None


def compile_problem(device: str) -> str | None:
    """Why `device` cannot run torch.compile's default backend (inductor), or None: on CUDA it generates Triton
    kernels, so it needs the triton package (torch's CUDA wheels bring it)."""
    if device.startswith("cuda") and not triton_installed():
        return f"compile on {device} needs the triton package (torch.compile's inductor), which is not installed here"
    return None


def attention_problem(backend: str, device: str, capability: tuple[int, int] | None) -> str | None:
    """Why `device` (CUDA `capability`, None elsewhere) cannot run attention `backend`, or None when it can.

    The package check is diffusers' own: its public `attention_backend` context refuses a backend whose package
    is missing or too old, before any tensor is touched."""
    if backend == "native" or backend not in ATTENTION_BACKENDS:
        return None  # an unknown name is `validate_params`' to refuse
    if backend == "sage" and not sage_installed():
        return "sage attention needs the sageattention package, which is not installed here (a CUDA/Triton package)"
    what = CUDA_ONLY_BACKENDS.get(backend)
    if what is not None and not device.startswith("cuda"):
        return f"{backend}: {what} runs on CUDA only, not on {device}; on {device} use native or _native_flash"
    least = BACKEND_CAPABILITY.get(backend)
    if least is not None and capability is not None and capability < least:
        return (f"{backend} needs CUDA compute capability {least[0]}.{least[1]} or newer; {device} has "
                f"{capability[0]}.{capability[1]}")
    return _diffusers_refusal(backend)


def _diffusers_refusal(backend: str) -> str | None:
    """diffusers' own requirement check of `backend` (its package present, new enough), in one line."""
    from diffusers import attention_backend

    try:
        with attention_backend(backend):
            pass
    except (RuntimeError, ValueError, ImportError) as exc:
        return f"{backend}: {str(exc).splitlines()[0]}"
    return None


def step_cache_problem(cache: str | None) -> str | None:
    """Why step cache `cache` cannot be used with H3, or None."""
    if cache is None:
        return None
    if cache not in STEP_CACHES:
        return f"{cache!r} given; expected one of {', '.join(STEP_CACHES)} or unset"
    return UNAVAILABLE_CACHES.get(cache)


def lever_problems(values: dict[str, Any], device: str, capability: tuple[int, int] | None) -> dict[str, str]:
    """Field -> why `device` (CUDA `capability`) cannot run the levers in `values` (GenerateParams fields); the names
    themselves and the caches H3 cannot take are `validate_params`' to refuse. fp8 compute's and the weight-only
    quantizations' checks are `models.quantization.check`'s; both compiles need torch.compile's backend
    (`compile_problem`)."""
    problems = {}
    attention = attention_problem(values.get("attention") or "native", device, capability)
    if attention is not None:
        problems["attention"] = attention
    for field in ("compile", "vae_compile"):
        if values.get(field) is True:
            problem = compile_problem(device)
            if problem is not None:
                problems[field] = problem
    quantize = quantize_check.quantization_problem(values.get("quantize"), device, capability,
                                                   quantize_check.torchao_installed())
    if quantize is not None:
        problems["quantize"] = quantize
    return problems
