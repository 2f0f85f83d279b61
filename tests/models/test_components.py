"""Components built empty and filled by Drainboard's loader are diffusers' / transformers' own, bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loader import LoadOptions, known_placements, load_checkpoint
from core.errors import CheckpointError
from models.checkpoint.classes import build_empty, fp32_patterns
from models.checkpoint.components import load_aux, load_component, text_encoder_pruning
from models.synth.profiles import HIDDEN_STATE_LAYER, get_profile

MODES = known_placements()
DIFFUSERS = {"transformer": "MiniMaxH3Transformer3DModel", "vae": "AutoencoderKLMiniMaxH3",
             "audio_vae": "AutoencoderKLMiniMaxH3Audio"}


def _reference(root: Path, name: str, dtype: torch.dtype):
    """The component as diffusers' / transformers' own `from_pretrained` loads it."""
    if name == "text_encoder":
        from transformers import Qwen3VLForConditionalGeneration

        return Qwen3VLForConditionalGeneration.from_pretrained(root / name, dtype=dtype).eval()
    import diffusers

    return getattr(diffusers, DIFFUSERS[name]).from_pretrained(root, subfolder=name, torch_dtype=dtype).eval()


def _tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def _assert_identical(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    assert ours.keys() <= theirs.keys()
    for name, tensor in ours.items():
        ref = theirs[name]
        assert tensor.dtype == ref.dtype and tensor.device == ref.device, name
        assert torch.equal(tensor, ref), name


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["transformer", "vae", "audio_vae"])
def test_diffusers_components_are_bit_identical_to_from_pretrained(h3_tiny: Path, name: str, mode: str):
    module, report = load_component(h3_tiny, name, mode=mode, dtype="bf16")
    reference = _reference(h3_tiny, name, torch.bfloat16)
    assert type(module) is type(reference)
    assert _tensors(module).keys() == _tensors(reference).keys()
    _assert_identical(_tensors(module), _tensors(reference))
    assert report.tensors_placed == len(module.state_dict()) and not report.missing and not report.excluded


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_text_encoder_reads_only_what_t2va_uses_and_matches_the_full_model(h3_tiny: Path, mode: str):
    module, report = load_component(h3_tiny, "text_encoder", mode=mode, dtype="bf16")
    reference = _reference(h3_tiny, "text_encoder", torch.bfloat16)
    _assert_identical(_tensors(module), _tensors(reference))
    full = reference.state_dict()
    skipped = {n for n in full if n not in module.state_dict()}
    assert set(report.excluded) == skipped and report.excluded_tensors == len(skipped)
    assert report.excluded_bytes == sum(full[n].nbytes for n in skipped)
    assert any(n.startswith("lm_head.") for n in skipped) and any(n.startswith("model.visual.") for n in skipped)
    layers = len(module.model.language_model.layers)
    assert layers == HIDDEN_STATE_LAYER + 1 < reference.config.text_config.num_hidden_layers
    if mode == "stream":
        total = sum(t.nbytes for t in full.values())
        assert report.bytes_read == total - report.excluded_bytes
    ids = torch.tensor([[5, 17, 42, 99, 3, 250]])
    ours = module.model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states[HIDDEN_STATE_LAYER]
    theirs = reference.model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states[HIDDEN_STATE_LAYER]
    assert torch.equal(ours, theirs)
    with pytest.raises(RuntimeError, match="lm_head was not loaded"):
        module.lm_head(ours)


def test_the_conditioning_layer_is_the_pipelines():
    from diffusers import MiniMaxH3ModularPipeline

    assert MiniMaxH3ModularPipeline.text_encoder_layer.fget(None) == HIDDEN_STATE_LAYER


def test_keyframe_workflows_keep_the_vision_tower(h3_tiny: Path):
    module, report = load_component(h3_tiny, "text_encoder", workflow="fl2va")
    assert any(n.startswith("model.visual.") for n in module.state_dict())
    assert not any(n.startswith("model.visual.") for n in report.excluded)


def test_dtype_rule_is_any_dotted_part_in_keep_in_fp32_modules():
    from diffusers import MiniMaxH3Transformer3DModel

    import re

    patterns = [re.compile(p) for p in fp32_patterns(MiniMaxH3Transformer3DModel)]
    kept = lambda name: any(p.search(name) for p in patterns)  # noqa: E731
    assert kept("proj_in.weight") and kept("audio_proj_out.bias") and kept("time_embedder.linear_1.weight")
    assert not kept("context_embedder.weight") and not kept("transformer_blocks.0.attn.to_q.weight")
    assert not kept("xproj_in.weight") and not kept("proj_inner.weight")


@pytest.mark.parametrize("dtype", [None, "fp32", "bf16"])
def test_transformer_dtypes_follow_diffusers(h3_tiny: Path, dtype):
    module, _ = load_component(h3_tiny, "transformer", dtype=dtype)
    stored = {"proj_in.weight": torch.float32, "context_embedder.weight": torch.bfloat16}  # the release's mix
    wanted = {None: stored, "fp32": {k: torch.float32 for k in stored}, "bf16": stored}[dtype]
    assert {k: module.get_parameter(k).dtype for k in stored} == wanted
    assert module.rope.inv_freq.dtype == torch.float32


def test_rope_buffer_is_computed_not_left_empty(h3_tiny: Path):
    """The buffer is not in the checkpoint: built wholly on meta it has no value, and `to_empty` fills it with garbage."""
    from diffusers import MiniMaxH3Transformer3DModel

    config = json.loads((h3_tiny / "transformer" / "config.json").read_text())
    assert not any("inv_freq" in n for n in json.loads(
        (h3_tiny / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())["weight_map"])
    with torch.device("meta"):
        naive = MiniMaxH3Transformer3DModel.from_config(config)
    assert naive.rope.inv_freq.is_meta
    theta, dim = config["rope_theta"], config["rope_freq_dim"]
    expected = 1.0 / theta ** (torch.arange(0, 2 * dim, 2, dtype=torch.float32) / (2 * dim))
    assert torch.equal(build_empty(config).rope.inv_freq, expected)
    with torch.device("meta"):  # what the loader's registry path does around the builder
        assert torch.equal(build_empty(config).rope.inv_freq, expected)
    module, _ = load_component(h3_tiny, "transformer", dtype="bf16")
    assert torch.equal(module.rope.inv_freq, expected)


def test_transformer_forward_matches_diffusers_bit_for_bit(h3_tiny: Path):
    """End to end through the rope buffer: the same inputs give the same velocities."""
    module, _ = load_component(h3_tiny, "transformer", dtype="bf16")
    reference = _reference(h3_tiny, "transformer", torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    video, audio, text = 6, 4, 3
    seq = video + audio + text
    inputs = dict(
        hidden_states=torch.randn(1, video, 96, generator=g), audio_hidden_states=torch.randn(1, audio, 32, generator=g),
        encoder_hidden_states=torch.randn(1, text, 32, generator=g), timestep=torch.tensor([0.3, 0.7]),
        timestep_indices=torch.tensor([0] * video + [1] * audio + [0] * text),
        token_tags=torch.tensor([0] * video + [2] * audio + [1] * text),
        position_ids=torch.randint(0, 8, (seq, 3), generator=g), video_indices=torch.arange(video),
        audio_indices=torch.arange(video, video + audio), text_indices=torch.arange(video + audio, seq),
    )
    ours, theirs = module(**inputs), reference(**inputs)
    assert torch.equal(ours.sample, theirs.sample) and torch.equal(ours.audio_sample, theirs.audio_sample)
    module.rope.inv_freq.mul_(1.001)
    assert not torch.equal(module(**inputs).sample, theirs.sample)


def test_real_size_text_encoder_skip_is_62_1_to_47_8_gib():
    profile = get_profile("h3")
    from models.synth.writer import _class_config
    from models.checkpoint.text_aux import build_tokenizer

    config = _class_config(profile, "text_encoder", torch.bfloat16, build_tokenizer(8))
    module = build_empty(config)
    paths = text_encoder_pruning(module, "t2va")
    state = module.state_dict()
    skipped = sum(t.numel() * 2 for n, t in state.items() if n.startswith(tuple(p + "." for p in paths)))
    total = sum(t.numel() * 2 for t in state.values())
    assert (round(total / 2**30, 1), round((total - skipped) / 2**30, 1)) == (62.1, 47.8)


def test_the_loaders_registry_builds_diffusers_classes(h3_tiny: Path, monkeypatch):
    from loader import model_registry
    from models.checkpoint.components import register_builders

    monkeypatch.setattr(model_registry, "_BUILDERS", dict(model_registry._BUILDERS))
    register_builders()
    module, report = load_checkpoint(h3_tiny, LoadOptions(component="transformer", dtype="bf16"))
    assert type(module).__name__ == "MiniMaxH3Transformer3DModel"
    assert module.proj_in.weight.dtype == torch.float32 and module.context_embedder.weight.dtype == torch.bfloat16
    assert not module.rope.inv_freq.is_meta and not report.missing


@pytest.mark.slow
def test_python_m_loader_load_builds_diffusers_class_through_the_builder_plugin(h3_tiny: Path):
    done = subprocess.run([sys.executable, "-m", "loader", "load", str(h3_tiny), "--component", "transformer",
                           "--dtype", "bf16", "--json"], capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    assert report["module_class"] == DIFFUSERS["transformer"]
    assert report["tensors_placed"] == 52 and not report["missing"] and not report["unexpected"]


def test_the_repos_plugin_registers_h3s_classes_when_the_loader_asks(monkeypatch):
    import sys

    from core import plugins
    from loader import model_registry

    monkeypatch.setattr(model_registry, "_BUILDERS", {})
    monkeypatch.setattr(model_registry, "_SOURCES", {})
    monkeypatch.setattr(plugins, "_loaded", [])
    monkeypatch.delitem(sys.modules, "drainboard_plugins.minimax_h3", raising=False)
    assert model_registry.load_model_builders() == ["minimax_h3"]
    assert model_registry.get_model_builder("AutoencoderKLMiniMaxH3Audio") is not None


@pytest.mark.slow
def test_loader_inspect_lists_every_component_with_its_class(h3_tiny: Path):
    done = subprocess.run([sys.executable, "-m", "loader", "inspect", str(h3_tiny), "--json"],
                          capture_output=True, text=True, check=True)
    summary = json.loads(done.stdout)
    assert summary["pipeline_class"] == "MiniMaxH3ModularPipeline"
    classes = {c["name"]: c["class_name"] for c in summary["components"]}
    assert classes == {"text_encoder": "Qwen3VLForConditionalGeneration", "transformer": DIFFUSERS["transformer"],
                       "transformer_ref": DIFFUSERS["transformer"], "vae": DIFFUSERS["vae"],
                       "audio_vae": DIFFUSERS["audio_vae"]}
    assert {a["name"] for a in summary["non_weight"]} == {"tokenizer", "processor", "scheduler", "audio_scheduler"}


def test_load_aux_builds_schedulers_locally_and_names_bad_folders(h3_tiny: Path, tmp_path: Path):
    assert load_aux(h3_tiny, "scheduler").config.shift == 12.0
    assert load_aux(h3_tiny, "audio_scheduler").config.shift == 3.0
    with pytest.raises(CheckpointError, match=r"unknown non-weight component 'vae'"):
        load_aux(h3_tiny, "vae")
    with pytest.raises(CheckpointError, match=rf"{tmp_path / 'scheduler'}: no such folder"):
        load_aux(tmp_path, "scheduler")
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "scheduler_config.json").write_text('{"_class_name": "DDIMScheduler"}')
    with pytest.raises(CheckpointError, match=r"_class_name is 'DDIMScheduler', expected 'MiniMaxH3Scheduler'"):
        load_aux(tmp_path, "scheduler")


def test_load_component_names_a_missing_config(tmp_path: Path):
    (tmp_path / "transformer").mkdir()
    with pytest.raises(CheckpointError, match=rf"{tmp_path / 'transformer' / 'config.json'}: no such file"):
        load_component(tmp_path, "transformer")
