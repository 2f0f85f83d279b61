"""What the speed levers add to a run's memory: what configs tell (a step cache's buffers), and what only a GPU
run could fit, said rather than guessed."""

from __future__ import annotations

from ..request.params import GenerateParams, ModelSpec
from ..quantization.check import FP8_COMPUTE


def step_cache_bytes(model: ModelSpec, cache: str | None, tokens: int, dtype_bytes: int) -> int:
    """The buffers a step cache keeps on the DiT: TaylorSeer keeps, for each block's attention (the modules its
    default patterns hook), `max_order + 1` Taylor factors of the attention's output (packed rows x hidden) in its
    `taylor_factors_dtype`, at diffusers' config defaults. 0 without a cache."""
    if cache is None:
        return 0
    import torch

    from ..speed.speedups import cache_config

    config = cache_config(cache)
    dit = model.configs["transformer"]
    element = torch.empty((), dtype=config.taylor_factors_dtype).element_size() if config.taylor_factors_dtype \
        else dtype_bytes
    return int(dit["num_layers"]) * (config.max_order + 1) * tokens * int(dit["hidden_size"]) * element


def lever_memory_unknown(params: GenerateParams) -> list[str]:
    """The levers of `params` whose memory the forecast cannot know from configs, each in one line."""
    unknown = []
    if params.compile:
        unknown.append("compile: the compiled blocks' workspace and the compiler's own memory are not counted; only "
                       "a GPU run can fit them (bench/bench_levers.py)")
    if params.vae_compile:
        unknown.append("vae_compile: the compiled decoder blocks' workspace and the compiler's own memory are not "
                       "counted; only a GPU run can fit them (bench/bench_levers.py, case vae-compile)")
    if params.quantize == FP8_COMPUTE:
        unknown.append("fp8-compute: the fp8 weights are counted; the activations' fp8 copies and scales made as each "
                       "call runs are not; only a GPU run can fit them (bench/bench_levers.py)")
    if params.attention != "native":
        unknown.append(f"attention {params.attention}: the denoise working set was fitted with native attention; this "
                       "backend's was not measured")
    return unknown
