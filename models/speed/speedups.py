"""The speed levers put on a loaded DiT and VAE, each through diffusers' public API (what each lever is:
`models.speed.levers`).

Order: the attention backend (`set_attention_backend`), then the step cache
(`enable_cache`), then regional compile (`compile_repeated_blocks`), so the
compiled blocks are the ones that run with the other two in place. fp8 compute
is a quantization, applied as the loader places each Linear (`models.quantization.quantize`).
A cache's hooks count steps only inside `cache_context`, which our denoise block
opens around each DiT call (`models.run.stage_blocks.DenoiserCall`). diffusers' hooks
keep no count of the calls they computed and the calls they predicted (their
state is private), so that block counts the DiT calls and `step_reused` says
which of them the cache's schedule predicts.

The VAE's lever is compile of its decoder's repeated blocks (`compile_vae_decoder`): H3's VAE declares its ViT
decoder's transformer block in `_repeated_blocks`, so diffusers' `compile_repeated_blocks` compiles those and
nothing of the encoder.
"""

from __future__ import annotations

import os
from typing import Any

import torch.nn as nn

from .levers import UNAVAILABLE_CACHES

COMPILE_BACKEND_ENV = "DRAINBOARD_VAE_COMPILE_BACKEND"
"""Names torch.compile's backend for `--vae-compile` (default `inductor`): `eager` captures the same graphs through
dynamo without generating code, for a CPU test that a compile's plumbing runs in seconds, or to tell a dynamo
failure from an inductor one."""
CACHE_REUSE_COUNTS = ("step cache: the DiT calls computed and reused are counted at Drainboard's denoise block from "
                      "the cache's schedule (diffusers' hooks keep no count)")
"""Said in a cached run's notes: how `steps_computed` and `steps_reused` were found."""


def cache_config(name: str) -> Any:
    """diffusers' config for step cache `name`, at its defaults."""
    if name in UNAVAILABLE_CACHES:
        raise ValueError(UNAVAILABLE_CACHES[name])
    if name == "taylorseer":
        from diffusers import TaylorSeerCacheConfig

        return TaylorSeerCacheConfig()
    raise ValueError(f"unknown step cache {name!r}")


def step_reused(name: str, call: int) -> bool:
    """Whether step cache `name` predicts its modules' outputs on the DiT's call `call` (0-based, counted inside one
    cache context) instead of computing them.

    The schedule TaylorSeer's hook applies to each call (diffusers 0.42), read from its public config: computed
    before `disable_cache_before_step`, on every `cache_interval`-th call after it and from
    `disable_cache_after_step` on; predicted otherwise. tests/models/test_levers.py holds it to the attention
    calls that ran."""
    config = cache_config(name)
    warmup = call < config.disable_cache_before_step
    refresh = (call - config.disable_cache_before_step - 1) % config.cache_interval == 0
    cooldown = config.disable_cache_after_step is not None and call >= config.disable_cache_after_step
    return not (warmup or refresh or cooldown)


def apply_levers(module: nn.Module, attention: str, step_cache: str | None, compile: bool) -> list[str]:
    """Put the levers on DiT `module`; the lines say what was applied, in order."""
    applied = []
    if attention != "native":
        module.set_attention_backend(attention)
        applied.append(f"attention backend {attention}")
    if step_cache is not None:
        module.enable_cache(cache_config(step_cache))
        applied.append(f"step cache {step_cache}")
    if compile:
        module.compile_repeated_blocks()
        applied.append("regional compile of the repeated blocks")
    return applied


def compile_vae_decoder(vae: nn.Module) -> str:
    """Compile video VAE `vae`'s decoder blocks with diffusers' `compile_repeated_blocks` (the backend from
    `COMPILE_BACKEND_ENV`); the line says what was applied. The compile runs at the decoder's first call."""
    backend = os.environ.get(COMPILE_BACKEND_ENV) or "inductor"
    vae.compile_repeated_blocks(backend=backend)
    return f"compile of the decoder's repeated blocks ({backend})"
