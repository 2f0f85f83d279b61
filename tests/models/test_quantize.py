"""int8 weight-only DiT on CPU (torchao): each Linear quantized as soon as it is placed, bytes the forecast can
predict, frames close to bf16's but not identical."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

try:
    import torchao  # noqa: F401
except ImportError:
    if os.environ.get("DRAINBOARD_REQUIRE_TORCHAO") == "1":  # CI installs it and must run these
        raise
    pytest.skip("torchao is the optional quantization dependency (requirements-quant.txt); CI runs these with it",
                allow_module_level=True)

from machine.device import DeviceInfo  # noqa: E402
from core.errors import PlacementError  # noqa: E402
from models.checkpoint.components import load_component  # noqa: E402
from models.request.params import GenerateParams  # noqa: E402
from models.run.pipeline import run_generate  # noqa: E402
from models.quantization.quantize import held_bytes, quant_config, quantized_bytes  # noqa: E402

UNIFIED = DeviceInfo(spec="cpu", kind="cpu", index=None, name="fake unified GPU", unified_memory=True,
                     total_memory=8 * 2**30, source="test", reason="a unified device for tests")


def test_each_linear_is_quantized_right_after_its_last_tensor_is_placed(h3_tiny: Path):
    order: list[tuple[str, str]] = []
    from models.quantization import quantize

    original = quantize.LinearQuantizer._quantize

    def spy(self, path):
        order.append(("quantized", path))
        original(self, path)

    quantize.LinearQuantizer._quantize = spy
    try:
        module, _ = load_component(h3_tiny, "transformer", dtype=torch.bfloat16, quantize="int8",
                                   on_tensor=lambda placed: order.append(("placed", placed.name)))
    finally:
        quantize.LinearQuantizer._quantize = original
    quantized = [p for kind, p in order if kind == "quantized"]
    assert quantized and all(type(module.get_submodule(p).weight).__name__ == "Int8Tensor" for p in quantized)
    for i, (kind, path) in enumerate(order):
        if kind == "quantized":  # the callback of the tensor that completed it comes right after
            assert order[i + 1][0] == "placed" and order[i + 1][1].rpartition(".")[0] == path
    assert held_bytes(module) == quantized_bytes(h3_tiny, "transformer", "int8")


def test_the_forecast_size_of_the_quantized_dit_is_smaller_and_exact_for_bf16(h3_tiny: Path):
    bf16_module, report = load_component(h3_tiny, "transformer", dtype=torch.bfloat16)
    assert quantized_bytes(h3_tiny, "transformer", None) == report.bytes_placed == held_bytes(bf16_module)
    assert quantized_bytes(h3_tiny, "transformer", "int8") < report.bytes_placed


@pytest.mark.slow
def test_int8_frames_are_close_to_bf16_but_not_identical(h3_tiny: Path, tmp_path: Path):
    params = GenerateParams(prompt="a red fox", frames=124, height=64, width=64, steps=3, seed=7, audio=False)
    frames = {}
    results = {}
    for kind in (None, "int8"):
        results[kind] = run_generate(h3_tiny, replace(params, quantize=kind), tmp_path / f"{kind}.mp4",
                                     device_info=UNIFIED)
        import av
        with av.open(results[kind].out_path) as c:
            frames[kind] = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)]).astype(np.float64)
    assert results["int8"].video_sha256 != results[None].video_sha256
    assert results["int8"].loads["transformer"]["bytes_held"] < results[None].loads["transformer"]["bytes_placed"]
    mse = np.mean((frames["int8"] - frames[None]) ** 2)
    assert mse < np.var(frames[None])  # far closer to bf16's frames than unrelated frames would be


def test_fp8_is_refused_off_cuda():
    with pytest.raises(PlacementError, match="compute capability 8.9"):
        quant_config("fp8", torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_quantized_dit_on_cuda_gives_its_memory_back_once_released(tmp_path: Path):
    """The caching allocator returns a segment only when all of it is free: a block reserved for the bf16 weights
    and half freed by quantization is pinned by whatever is allocated in it next, and the run never gets it back."""
    import gc

    from models.synth.writer import synth_h3
    from models.synth.profiles import get_profile

    tiny = get_profile("tiny")
    wide = replace(tiny, transformer={**tiny.transformer, "num_attention_heads": 8, "attention_head_dim": 128,
                                      "hidden_size": 1024, "ffn_dim": 8192})  # Linears of 2-16 MiB: the large pool
    synth_h3(tmp_path / "wide", wide, seed=0)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    module, _ = load_component(tmp_path / "wide", "transformer", device="cuda", dtype=torch.bfloat16,
                               quantize="int8")
    held = held_bytes(module)
    later = torch.ones(1 << 20, device="cuda")  # 4 MiB allocated after the load: the run's latents
    del module
    gc.collect()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() - before < held / 2, (torch.cuda.memory_reserved() - before, held)
    del later


def test_a_lora_is_merged_into_each_linear_before_it_is_quantized(h3_tiny: Path, tmp_path: Path):
    import copy
    import json

    from torchao.quantization import quantize_

    from models.lora.inputs import LoraInput
    from models.lora.merge import merge_adjustments

    from .lora_files import write_peft_lora

    path = write_peft_lora(h3_tiny.parent / "quantized-style.safetensors", h3_tiny, rank=4, seed=9,
                           modules=["transformer_blocks.0.attn.to_q"])
    config = json.loads((h3_tiny / "transformer" / "config.json").read_text())

    def adjust():
        return merge_adjustments([LoraInput(str(path), 1.0, partition="transformer")], "transformer", config,
                                 [h3_tiny.parent])[0]

    merged, _ = load_component(h3_tiny, "transformer", dtype=torch.bfloat16, adjust=adjust(), roots=[h3_tiny.parent])
    expected = copy.deepcopy(merged.get_submodule("transformer_blocks.0.attn.to_q"))
    quantize_(expected, quant_config("int8", torch.device("cpu")))
    quantized, _ = load_component(h3_tiny, "transformer", dtype=torch.bfloat16, quantize="int8", adjust=adjust(),
                                  roots=[h3_tiny.parent])
    ours, theirs = quantized.get_submodule("transformer_blocks.0.attn.to_q").weight, expected.weight
    names = ours.__tensor_flatten__()[0]
    assert names and all(torch.equal(getattr(ours, n), getattr(theirs, n)) for n in names)
