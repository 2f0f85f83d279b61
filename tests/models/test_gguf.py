"""A GGUF DiT (MiniMax H3's single file, quantized, as community GGUFs are): loaded quantized by diffusers' GGUF
path, counted at its real size by the forecast, generating the frames diffusers' own GGUF load gives, and
every file it cannot run refused at submit in one line."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from models.request.params import GenerateParamsError, ModelSpec, validate_params
from tests.loader.gguf_files import gguf_bytes, require_gguf, write
from tests.models.reference_layout import reference_tensors, write_gguf
from tests.models.test_pipeline import SMALL, UNIFIED

FAST = replace(SMALL, steps=2, audio=False)


@pytest.fixture(scope="module")
def q8_file(h3_tiny: Path, tmp_path_factory) -> Path:
    """The tiny DiT in the reference layout, quantized to Q8_0 by the gguf package (its 2-D weights whose rows
    fill 32-value blocks; the rest F32)."""
    require_gguf()
    return write_gguf(reference_tensors(h3_tiny / "transformer"), tmp_path_factory.mktemp("gguf") / "h3-Q8_0.gguf")


def _diffusers_dit(h3_tiny: Path, file: Path, dtype: torch.dtype):
    from diffusers import GGUFQuantizationConfig, MiniMaxH3Transformer3DModel

    return MiniMaxH3Transformer3DModel.from_single_file(
        str(file), config=str(h3_tiny), subfolder="transformer", local_files_only=True, torch_dtype=dtype,
        quantization_config=GGUFQuantizationConfig(compute_dtype=dtype))


def test_the_dit_stays_quantized_holds_diffusers_own_weights_and_the_forecast_counts_them(h3_tiny, q8_file,
                                                                                           monkeypatch):
    import socket

    from models.checkpoint.components import load_component
    from models.forecast import weight_bytes

    def no_network(*args):
        raise AssertionError(f"the GGUF load tried to connect to {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", no_network)  # nothing contacts a hub
    module, report = load_component(h3_tiny, "transformer", dtype=torch.bfloat16, single_file=q8_file)
    monkeypatch.undo()
    theirs = _diffusers_dit(h3_tiny, q8_file, torch.bfloat16).state_dict()
    ours = module.state_dict()
    assert ours.keys() == theirs.keys()
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []
    packed = {k: getattr(p, "quant_type", None) for k, p in module.named_parameters()}
    assert packed["transformer_blocks.0.attn.to_q.weight"] == 8  # GGML Q8_0: kept packed, not dequantized
    assert ours["transformer_blocks.0.attn.to_q.weight"].dtype == torch.uint8
    assert report.mode == "diffusers-gguf" and report.tensors_placed == 46
    assert report.bytes_read == q8_file.stat().st_size - read_data_start(q8_file) - alignment_padding(q8_file)
    held = sum(p.numel() * p.element_size() for p in module.parameters())
    assert weight_bytes(h3_tiny, transformer=str(q8_file))["transformer"] == held == report.bytes_placed
    assert held < weight_bytes(h3_tiny)["transformer"]


def read_data_start(file: Path) -> int:
    from loader.gguf_header import read_gguf_header

    return read_gguf_header(file).data_start


def alignment_padding(file: Path) -> int:
    """Bytes of the data area between tensors (each starts on the 32-byte alignment)."""
    from loader.gguf_header import read_gguf_header

    tensors = sorted(read_gguf_header(file).tensors, key=lambda t: t.offset)
    ends = [t.offset + t.nbytes for t in tensors]
    return sum(b.offset - e for e, b in zip(ends, tensors[1:])) + (file.stat().st_size - ends[-1])


def _digest(videos) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(videos)[0], dtype=np.float32).tobytes()).hexdigest()


@pytest.mark.slow
def test_seed_contract_a_gguf_dit_generates_diffusers_own_gguf_frames(h3_tiny, q8_file, tmp_path):
    """Both sides in float32 (compute dtype included), as the safetensors single file's contract: diffusers'
    `from_single_file` casts every plain tensor to one dtype, so float32 is where both hold the same values."""
    from diffusers import ModularPipeline

    from models.checkpoint.components import load_aux
    from models.run.pipeline import run_generate

    result = run_generate(h3_tiny, replace(FAST, transformer=str(q8_file)), tmp_path / "c.mp4",
                          dtype=torch.float32, device_info=UNIFIED)
    assert result.loads["transformer"]["mode"] == "diffusers-gguf"
    pipe = ModularPipeline.from_pretrained(str(h3_tiny), workflow="t2va")
    pipe.load_components(dtype=torch.float32)
    if pipe.processor is None:  # Qwen3VLProcessor's video part needs torchvision, which this box lacks
        pipe.update_components(processor=load_aux(h3_tiny, "processor"))
    pipe.update_components(transformer=_diffusers_dit(h3_tiny, q8_file, torch.float32))
    state = pipe(prompt=FAST.prompt, num_frames=FAST.frames, height=FAST.height, width=FAST.width,
                 num_inference_steps=FAST.steps, generator=torch.Generator("cpu").manual_seed(FAST.seed),
                 output_type="np")
    assert result.video_sha256 == _digest(state.get("videos"))


def _problem(h3_tiny: Path, file: Path) -> str:
    with pytest.raises(GenerateParamsError) as refused:
        validate_params(replace(FAST, transformer=str(file)), ModelSpec.read(h3_tiny))
    message = str(refused.value)
    assert message.startswith(f"transformer: {file.name}: ") and "\n" not in message
    return message.removeprefix(f"transformer: {file.name}: ")


def _tiny_shapes(h3_tiny: Path, quant: str = "Q8_0") -> list[tuple[str, tuple[int, ...], str]]:
    """The tiny DiT's reference tensors as (name, shape, type): `quant` where rows fill its blocks, else F32."""
    block = {"Q8_0": 32, "IQ2_XXS": 256, "Q4_K": 256}[quant]
    return [(name, tuple(t.shape), quant if t.ndim == 2 and t.shape[-1] % block == 0 else "F32")
            for name, t in reference_tensors(h3_tiny / "transformer").items()]


def test_corrupt_or_unrunnable_gguf_files_are_refused_at_submit_in_one_line(h3_tiny, tmp_path, monkeypatch):
    import models.checkpoint.gguf

    monkeypatch.setattr(models.checkpoint.gguf, "gguf_installed", lambda: True)  # the header checks need no package
    good = gguf_bytes(_tiny_shapes(h3_tiny))
    assert models.checkpoint.gguf.gguf_problem(write(tmp_path / "good.gguf", good), ModelSpec.read(h3_tiny).configs["transformer"]) is None
    assert _problem(h3_tiny, write(tmp_path / "cut.gguf", good[:300])).startswith("truncated GGUF header: the file ends")
    assert _problem(h3_tiny, write(tmp_path / "st.gguf", struct.pack("<Q", 2) + b"{}")).startswith(
        "not a GGUF file (it starts with")
    wide = [(n, tuple(2 * d if d % 32 == 0 else d for d in s), k) for n, s, k in _tiny_shapes(h3_tiny)]
    assert _problem(h3_tiny, write(tmp_path / "wide.gguf", gguf_bytes(wide))) == (
        "a DiT of 2 blocks of width 64, but the model's transformer/config.json says 2 blocks of width 32; give "
        "--model the folder of the same model size")
    iq2 = [(n, (s[0], 256) if n.endswith("video_out.weight") else s, "IQ2_XXS" if n.endswith("video_out.weight")
            else k) for n, s, k in _tiny_shapes(h3_tiny)]
    assert _problem(h3_tiny, write(tmp_path / "iq2.gguf", gguf_bytes(iq2))).startswith(
        "tensor final_layer.video_out.weight is IQ2_XXS, a quant type diffusers' GGUF path cannot run (it runs F32,")
    other = gguf_bytes([("token_embd.weight", (64, 32), "Q8_0")])
    assert _problem(h3_tiny, write(tmp_path / "llm.gguf", other)).startswith(
        "not a MiniMax H3 DiT in the original layout")
    with pytest.raises(GenerateParamsError, match="quantize: a GGUF DiT is quantized already"):
        validate_params(replace(FAST, transformer=str(tmp_path / "good.gguf"), quantize="int8"), ModelSpec.read(h3_tiny))
    with pytest.raises(GenerateParamsError, match="parallel: is not combined with a GGUF DiT"):
        validate_params(replace(FAST, transformer=str(tmp_path / "good.gguf"), parallel=2), ModelSpec.read(h3_tiny))


def test_without_the_gguf_package_a_gguf_dit_is_refused_naming_the_extra(h3_tiny, tmp_path, monkeypatch):
    import models.checkpoint.gguf

    monkeypatch.setattr(models.checkpoint.gguf, "gguf_installed", lambda: False)
    file = write(tmp_path / "good.gguf", gguf_bytes(_tiny_shapes(h3_tiny)))
    assert _problem(h3_tiny, file) == ("a GGUF DiT needs the optional gguf package, which is not installed: "
                                       "pip install -r requirements-gguf.txt")


def test_the_runnable_quant_types_are_diffusers_own():
    gguf = require_gguf()
    from diffusers.quantizers.gguf.utils import SUPPORTED_GGUF_QUANT_TYPES

    from models.checkpoint.gguf import RUNNABLE

    plain = [gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16]  # loaded as plain tensors
    assert sorted(RUNNABLE) == sorted(t.name for t in [*plain, *SUPPORTED_GGUF_QUANT_TYPES])


def test_a_folder_without_the_dit_s_config_hands_diffusers_the_default_config(h3_tiny, q8_file, tmp_path,
                                                                               monkeypatch):
    """diffusers builds the GGUF DiT from the config submit checked the file against: here the default config
    (swapped for the tiny profile's, as the safetensors defaults test does), the folder having none."""
    import json
    import shutil

    import models.checkpoint.classes
    from models.checkpoint.components import load_component

    tiny = json.loads((h3_tiny / "transformer" / "config.json").read_text())
    monkeypatch.setattr(models.checkpoint.classes, "default_dit_config", lambda: tiny)
    folder = tmp_path / "no-dit"
    shutil.copytree(h3_tiny, folder, ignore=shutil.ignore_patterns("transformer"))
    validate_params(replace(FAST, transformer=str(q8_file)), ModelSpec.read(folder))
    module, _ = load_component(folder, "transformer", dtype=torch.bfloat16, single_file=q8_file,
                               roots=[folder, q8_file.parent])
    theirs = _diffusers_dit(h3_tiny, q8_file, torch.bfloat16).state_dict()
    assert [k for k, v in module.state_dict().items() if not torch.equal(v, theirs[k])] == []
