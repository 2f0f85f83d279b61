"""The speed levers put on a loaded DiT, each through diffusers' public API (what each lever is: `models.levers`).

Order: the attention backend (`set_attention_backend`), then the step cache
(`enable_cache`), then regional compile (`compile_repeated_blocks`), so the
compiled blocks are the ones that run with the other two in place. fp8 compute
is a quantization, applied as the loader places each Linear (`models.quantize`).
A cache's hooks count steps only inside `cache_context`, which our denoise block
opens around each DiT call (`models.stage_blocks.DenoiserCall`).
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from .levers import UNAVAILABLE_CACHES

CACHE_REUSE_COUNTS = ("diffusers' TaylorSeer hook does not expose how many calls it computed and how many it "
                      "predicted, so the run does not record them")
"""Said in a cached run's notes: the split of computed and reused steps is the hooks' to tell, and they do not."""


def cache_config(name: str) -> Any:
    """diffusers' config for step cache `name`, at its defaults."""
    if name in UNAVAILABLE_CACHES:
        raise ValueError(UNAVAILABLE_CACHES[name])
    if name == "taylorseer":
        from diffusers import TaylorSeerCacheConfig

        return TaylorSeerCacheConfig()
    raise ValueError(f"unknown step cache {name!r}")


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
