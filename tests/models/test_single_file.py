"""A MiniMax H3 DiT as one file in the reference layout (Comfy-Org's): placed tensor by tensor into diffusers'
class, generating the frames diffusers' own `from_single_file` gives, misaligned data offsets included."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from models.checkpoint.components import load_component
from models.request.params import GenerateParamsError, ModelSpec, validate_params
from models.run.pipeline import run_generate
from models.checkpoint.single_file import transformer_problem
from tests.models.reference_layout import reference_tensors, write_single_file
from tests.models.test_pipeline import SMALL, UNIFIED

FAST = replace(SMALL, steps=2, audio=False)


@pytest.fixture(scope="module")
def reference_files(h3_tiny: Path, tmp_path_factory) -> dict[str, Path]:
    """The tiny DiT as single files: stacked with 8-byte-aligned data, stacked with every tensor at an odd
    offset (data area at 5 mod 8, as public reports say Comfy-Org's are), interleaved at 7 mod 8."""
    folder = tmp_path_factory.mktemp("single")
    stacked = reference_tensors(h3_tiny / "transformer")
    return {
        "aligned": write_single_file(stacked, folder / "h3-aligned.safetensors"),
        "misaligned": write_single_file(stacked, folder / "h3-misaligned.safetensors", data_start_mod8=5),
        "interleaved": write_single_file(reference_tensors(h3_tiny / "transformer", qkv_layout="interleaved"),
                                         folder / "h3-interleaved.safetensors", data_start_mod8=7),
    }


@pytest.mark.parametrize("mode", ["stream", "drain"])
@pytest.mark.parametrize("which, layout", [("aligned", "stacked"), ("misaligned", "stacked"),
                                           ("interleaved", "interleaved")])
def test_each_tensor_lands_where_the_diffusers_layout_puts_it_read_once(h3_tiny, reference_files, which, layout, mode):
    file = reference_files[which]
    assert which == "aligned" or (8 + int.from_bytes(file.read_bytes()[:8], "little")) % 2 == 1
    folder, _ = load_component(h3_tiny, "transformer", dtype=torch.bfloat16)
    single, report = load_component(h3_tiny, "transformer", dtype=torch.bfloat16, mode=mode, single_file=file,
                                    qkv_layout=layout)
    expected, placed = folder.state_dict(), single.state_dict()
    assert placed.keys() == expected.keys()
    assert [k for k in expected if not torch.equal(expected[k], placed[k])] == []
    on_disk = sum(t.numel() * t.element_size() for t in reference_tensors(h3_tiny / "transformer").values())
    assert report.bytes_read == on_disk  # every byte read once: no fused tensor read whole, then cut


def test_the_wrong_qkv_layout_gives_other_weights_the_file_cannot_tell(h3_tiny, reference_files):
    folder, _ = load_component(h3_tiny, "transformer", dtype=torch.bfloat16)
    wrong, _ = load_component(h3_tiny, "transformer", dtype=torch.bfloat16, single_file=reference_files["interleaved"])
    name = "transformer_blocks.0.attn.to_q.weight"
    assert not torch.equal(folder.state_dict()[name], wrong.state_dict()[name])


def _digest(videos) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(videos)[0], dtype=np.float32).tobytes()).hexdigest()


def _diffusers_frames(h3_tiny: Path, file: Path, layout: str) -> str:
    """diffusers' own pipeline with its own `from_single_file` DiT, all in float32: `from_single_file` loads
    every tensor at one dtype (float32 unless told; under bfloat16 it casts even the modules its class keeps in
    float32, which `from_pretrained` and Drainboard keep), so float32 is where both sides hold the same values."""
    from diffusers import MiniMaxH3Transformer3DModel, ModularPipeline

    from models.checkpoint.components import load_aux

    pipe = ModularPipeline.from_pretrained(str(h3_tiny), workflow="t2va")
    pipe.load_components(dtype=torch.float32)
    if pipe.processor is None:  # Qwen3VLProcessor's video part needs torchvision, which this box lacks
        pipe.update_components(processor=load_aux(h3_tiny, "processor"))
    dit = MiniMaxH3Transformer3DModel.from_single_file(str(file), config=str(h3_tiny), subfolder="transformer",
                                                       local_files_only=True, qkv_layout=layout)
    for parameter in dit.parameters():
        # diffusers keeps q, k and v as views into the fused tensor (torch.chunk), on the file's mapping; CPU
        # GEMM picks its kernel by pointer alignment, so the same values at other addresses round differently.
        # Each tensor gets an allocation of its own, as a load places it: values untouched.
        parameter.data = parameter.data.clone()
    pipe.update_components(transformer=dit)
    state = pipe(prompt=FAST.prompt, num_frames=FAST.frames, height=FAST.height, width=FAST.width,
                 num_inference_steps=FAST.steps, generator=torch.Generator("cpu").manual_seed(FAST.seed),
                 output_type="np")
    return _digest(state.get("videos"))


@pytest.mark.slow
@pytest.mark.parametrize("which, layout", [("misaligned", "stacked"), ("interleaved", "interleaved")])
def test_seed_contract_a_single_file_dit_generates_diffusers_own_from_single_file_frames(
        h3_tiny, reference_files, tmp_path, which, layout):
    file = reference_files[which]
    result = run_generate(h3_tiny, replace(FAST, transformer=str(file), qkv_layout=layout), tmp_path / "c.mp4",
                          dtype=torch.float32, device_info=UNIFIED)
    assert result.video_sha256 == _diffusers_frames(h3_tiny, file, layout)
    assert result.loads["transformer"]["tensors_placed"] == 52


def test_a_pruned_single_file_is_refused_in_one_line(h3_tiny, tmp_path):
    tensors = reference_tensors(h3_tiny / "transformer")
    tensors["adaln_t_table"] = torch.zeros(1000, 16)
    file = write_single_file(tensors, tmp_path / "pruned.safetensors")
    problem = transformer_problem(str(file), ModelSpec.read(h3_tiny).configs["transformer"])
    assert problem == ("pruned.safetensors: a pruned MiniMax H3 DiT: it has adaln_t_table (1000, 16) in place of "
                       "time_embedder, which diffusers' MiniMaxH3Transformer3DModel does not take; use the unpruned DiT")


def test_a_single_file_of_another_model_or_size_is_refused_naming_what_was_found(h3_tiny, h3_demo, tmp_path):
    other = write_single_file({"encoder.layer.0.weight": torch.ones(4, 4)}, tmp_path / "bert.safetensors")
    with pytest.raises(GenerateParamsError) as refused:
        validate_params(replace(FAST, transformer=str(other)), ModelSpec.read(h3_tiny))
    assert "transformer: bert.safetensors: not a MiniMax H3 DiT in the original layout" in str(refused.value)
    assert "encoder.layer.0.weight" in str(refused.value)
    demo = write_single_file(reference_tensors(h3_demo / "transformer"), tmp_path / "demo.safetensors")
    problem = transformer_problem(str(demo), ModelSpec.read(h3_tiny).configs["transformer"])
    assert problem == ("demo.safetensors: a DiT of 6 blocks of width 384, but the model's transformer/config.json "
                       "says 2 blocks of width 32; give --model the folder of the same model size")


def test_interleaved_without_a_single_file_is_refused(h3_tiny):
    with pytest.raises(GenerateParamsError, match="qkv_layout: only applies to a single-file DiT"):
        validate_params(replace(FAST, qkv_layout="interleaved"), ModelSpec.read(h3_tiny))


def test_models_forecast_counts_the_single_file_as_the_dit_and_refuses_another_in_one_line(
        h3_tiny, reference_files, tmp_path, capsys):
    import json

    from models.cli import main
    from models.forecast import weight_bytes

    file = reference_files["misaligned"]
    assert weight_bytes(h3_tiny, transformer=str(file))["transformer"] == weight_bytes(h3_tiny)["transformer"]
    base = ["forecast", str(h3_tiny), "--prompt", "a fox", "--height", "64", "--width", "64", "--steps", "2", "--json"]
    assert main(base) == 0
    folder = json.loads(capsys.readouterr().out)
    assert main([*base, "--transformer", str(file)]) == 0
    single = json.loads(capsys.readouterr().out)
    assert single["peak_bytes"] == folder["peak_bytes"] and single["stages"] == folder["stages"]
    other = write_single_file({"encoder.weight": torch.ones(2, 2)}, tmp_path / "bert.safetensors")
    assert main([*base, "--transformer", str(other)]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert "transformer: bert.safetensors: not a MiniMax H3 DiT in the original layout" in error


def _without_dit(h3_tiny: Path, folder: Path) -> Path:
    """The tiny model folder with no `transformer/` at all: a Comfy-style user's text encoder, VAEs and the rest."""
    import shutil

    shutil.copytree(h3_tiny, folder, ignore=shutil.ignore_patterns("transformer"))
    return folder


def test_without_the_dit_s_config_a_file_the_default_config_does_not_fit_is_refused_naming_the_file_and_the_fix(
        h3_tiny, tmp_path, reference_files):
    folder = _without_dit(h3_tiny, tmp_path / "no-dit")
    fix = f"put the DiT's config.json (the release's, or the one the file was made from) in {folder}/transformer/"
    with pytest.raises(GenerateParamsError) as refused:
        validate_params(replace(FAST, transformer=str(reference_files["aligned"])), ModelSpec.read(folder))
    assert str(refused.value) == (
        f"transformer: h3-aligned.safetensors: {folder} has no transformer/config.json, and diffusers' default "
        "MiniMaxH3Transformer3DModel config (the released H3: 50 blocks of width 5376) does not fit this file "
        f"(proj_in.weight is (32, 96) in the file, (5376, 96) in that DiT); {fix}")
    with pytest.raises(GenerateParamsError) as refused:
        validate_params(FAST, ModelSpec.read(folder))
    assert str(refused.value) == f"model: {folder} has no transformer/config.json; {fix}"


def test_without_the_dit_s_config_a_real_size_file_fits_diffusers_default_config_and_is_counted_at_its_size(
        h3_tiny, tmp_path):
    """diffusers' default config is the released H3's DiT: a single file of that size (a sparse file: headers
    only, the data a hole) passes the submit check against it, every tensor's shape compared."""
    from models.checkpoint.classes import build_empty, default_dit_config
    from models.forecast import weight_bytes
    from tests.models.reference_layout import write_header_only

    folder = _without_dit(h3_tiny, tmp_path / "no-dit")
    shapes = {n: tuple(t.shape) for n, t in build_empty(default_dit_config()).state_dict().items()
              if n != "rope.inv_freq"}
    file = write_header_only(shapes, tmp_path / "h3-dit.safetensors")
    model = ModelSpec.read(folder)
    assert model.dit_defaults and model.configs["transformer"]["num_layers"] == 50
    validate_params(replace(FAST, transformer=str(file)), model)
    assert weight_bytes(folder, transformer=str(file))["transformer"] >= 33_122_992_896 * 2  # bf16, fp32 modules at 4
    shapes.pop("proj_out.bias")
    short = write_header_only(shapes, tmp_path / "short.safetensors")
    with pytest.raises(GenerateParamsError, match=r"does not fit this file \(it lacks proj_out.bias and 0 more\)"):
        validate_params(replace(FAST, transformer=str(short)), model)


@pytest.mark.slow
def test_without_the_dit_s_config_a_fitting_file_generates_with_the_default_config(h3_tiny, tmp_path,
                                                                                   reference_files, monkeypatch):
    """At real size diffusers' defaults are the only config that fits; here the default is the tiny profile's
    config (the one substitution), so the whole run goes through the defaults path: the frames are those of
    the folder's own DiT."""
    import json

    import models.checkpoint.classes

    tiny = json.loads((h3_tiny / "transformer" / "config.json").read_text())
    monkeypatch.setattr(models.checkpoint.classes, "default_dit_config", lambda: tiny)
    folder = _without_dit(h3_tiny, tmp_path / "no-dit")
    single = run_generate(folder, replace(FAST, transformer=str(reference_files["misaligned"])), tmp_path / "s.mp4",
                          device_info=UNIFIED, roots=[folder, reference_files["misaligned"].parent])
    own = run_generate(h3_tiny, FAST, tmp_path / "f.mp4", device_info=UNIFIED)
    assert single.video_sha256 == own.video_sha256


@pytest.mark.parametrize("reader", ["threads", "io_uring"])
def test_the_gpu_ring_s_o_direct_reads_of_a_misaligned_file_land_every_byte_of_the_diffusers_layout(
        h3_tiny, reference_files, reader):
    """What `stream` runs to a CUDA device, its copy step on CPU destinations (device-agnostic, as
    tests/loader/test_stream_ring.py checks the ring): the single file's planned sources (renamed, each qkv
    part and FF half its own byte range, every one at an odd file offset) read with O_DIRECT through aligned
    chunks, landing the bytes of the diffusers-layout folder. The CUDA copy itself is not run here."""
    from safetensors.torch import load_file

    from loader.checkpoint import discover_checkpoint
    from loader.naming import plan_targets
    from loader.placement import LoadPlan, PlannedTarget
    from loader.placement.chunks import Piece
    from loader.placement.files import OpenFiles
    from models.checkpoint.single_file import reference_layout
    from tests.loader.ring_runs import run_ring

    file = reference_files["misaligned"]
    config = json.loads((h3_tiny / "transformer" / "config.json").read_text())
    layout = reference_layout(config)
    tensors = [t for t in discover_checkpoint(file).component().tensors if not layout.exclude(t.name)]
    targets, _ = plan_targets(tensors, layout.rename, layout.merges, layout.splits)
    assert all(s.offset % 2 == 1 for t in targets for s in t.sources)  # not even 2-byte aligned
    plan = LoadPlan(targets=[PlannedTarget(t, t.sources[0].torch_dtype) for t in targets])
    files = OpenFiles(plan, 0, direct_io=True)
    fallbacks = []
    buffered = files.fallback
    files.fallback = lambda f: fallbacks.append(f) or buffered(f)  # an O_DIRECT read the kernel refused
    outs, pieces = {}, []
    for planned in plan.targets:
        flat = torch.full((sum(s.nbytes for s in planned.target.sources),), 0xAB, dtype=torch.uint8)
        outs[planned.name], start = flat, 0
        for source in planned.target.sources:
            pieces.append(Piece(source, flat[start:start + source.nbytes], lambda s=source: files.done(s)))
            start += source.nbytes
    stats = run_ring(files, pieces, chunk=16 << 10, read=4 << 10, reader=reader)
    if stats.direct_chunks == 0:
        pytest.skip("this file system refuses O_DIRECT")
    assert stats.direct_chunks == stats.chunks > 1 and fallbacks == []
    folder = {}
    for shard in sorted((h3_tiny / "transformer").glob("*.safetensors")):
        folder.update(load_file(str(shard)))
    assert sorted(outs) == sorted(n for n in folder if n != "rope.inv_freq")
    assert [n for n, out in outs.items() if not torch.equal(out, folder[n].contiguous().view(-1).view(torch.uint8))] == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_stream_reads_a_misaligned_single_file_with_o_direct_bit_exactly(h3_tiny, reference_files):
    from loader.placement import get_placement

    folder, _ = load_component(h3_tiny, "transformer", dtype=torch.bfloat16)
    placement = get_placement("stream", direct_io=True)
    single, report = load_component(h3_tiny, "transformer", dtype=torch.bfloat16, device="cuda", mode=placement,
                                    single_file=reference_files["misaligned"])
    assert placement.last_ring is not None and placement.last_ring.direct_chunks == placement.last_ring.chunks > 0
    expected, placed = folder.state_dict(), single.state_dict()
    assert [k for k in expected if not torch.equal(expected[k], placed[k].cpu())] == []
