"""Synthetic checkpoints of the real MiniMax H3 architecture: the release's layout, sizes, precision, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from models.synth.writer import synth_h3
from models.synth.profiles import HIDDEN_STATE_LAYER, PROFILES, get_profile

DIFFUSERS_FOLDERS = ("transformer", "transformer_ref", "vae", "audio_vae")


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def test_tiny_root_has_the_release_layout(h3_tiny: Path):
    index = json.loads((h3_tiny / "modular_model_index.json").read_text())
    assert index["_class_name"] == "MiniMaxH3ModularPipeline"
    for name in ("text_encoder", "tokenizer", "processor", *DIFFUSERS_FOLDERS, "scheduler", "audio_scheduler"):
        assert index[name][2]["subfolder"] == name and (h3_tiny / name).is_dir()
    te = h3_tiny / "text_encoder"
    shards = sorted(p.name for p in te.glob("*.safetensors"))
    assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    assert len(shards) > 1
    assert json.loads((te / "config.json").read_text())["architectures"] == ["Qwen3VLForConditionalGeneration"]
    weight_map = json.loads((te / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(weight_map) == set(_tensors(te))
    for name in DIFFUSERS_FOLDERS:
        folder = h3_tiny / name
        assert json.loads((folder / "config.json").read_text())["_class_name"] == index[name][1]
        assert (folder / "diffusion_pytorch_model.safetensors.index.json").is_file()
        assert all(p.name.startswith("diffusion_pytorch_model-") for p in folder.glob("*.safetensors"))
    assert json.loads((h3_tiny / "scheduler" / "scheduler_config.json").read_text())["shift"] == 12.0
    assert json.loads((h3_tiny / "audio_scheduler" / "scheduler_config.json").read_text())["shift"] == 3.0


def test_precision_is_the_release_mix(h3_tiny: Path):
    dit = _tensors(h3_tiny / "transformer")
    for name, tensor in dit.items():
        pinned = name.split(".")[0] in ("proj_in", "audio_proj_in", "time_embedder", "proj_out", "audio_proj_out")
        assert tensor.dtype == (torch.float32 if pinned else torch.bfloat16), name
    assert {t.dtype for t in _tensors(h3_tiny / "vae").values()} == {torch.float32}
    assert {t.dtype for t in _tensors(h3_tiny / "audio_vae").values()} == {torch.float32}
    assert {t.dtype for t in _tensors(h3_tiny / "text_encoder").values()} == {torch.bfloat16}


def test_diffusers_and_transformers_load_every_folder_with_nothing_missing_or_unexpected(h3_tiny: Path):
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel
    from transformers import Qwen3VLForConditionalGeneration

    for cls, name in ((MiniMaxH3Transformer3DModel, "transformer"), (AutoencoderKLMiniMaxH3, "vae"),
                      (AutoencoderKLMiniMaxH3Audio, "audio_vae")):
        _, info = cls.from_pretrained(h3_tiny, subfolder=name, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], name
    _, info = Qwen3VLForConditionalGeneration.from_pretrained(h3_tiny / "text_encoder", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


def test_the_modular_pipeline_takes_its_components_from_the_folder(h3_tiny: Path):
    from diffusers import ModularPipeline

    pipe = ModularPipeline.from_pretrained(str(h3_tiny), workflow="t2va")
    assert type(pipe).__name__ == "MiniMaxH3ModularPipeline"
    pipe.load_components(names=["transformer", "scheduler", "audio_scheduler", "tokenizer"])
    assert pipe.transformer.config.hidden_size == PROFILES["tiny"].transformer["hidden_size"]
    assert (pipe.scheduler.config.shift, pipe.audio_scheduler.config.shift) == (12.0, 3.0)
    assert (pipe.config.canvas_short_edge, pipe.config.canvas_max_pixels) == PROFILES["tiny"].canvas
    assert pipe.tokenizer("a fox", add_special_tokens=False)["input_ids"]


def test_tokenizer_carries_qwens_special_tokens_where_the_encoder_config_expects_them(h3_tiny: Path):
    from models.checkpoint.components import load_aux

    tokenizer = load_aux(h3_tiny, "tokenizer")
    config = json.loads((h3_tiny / "text_encoder" / "config.json").read_text())
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == config["image_token_id"]
    assert tokenizer.convert_tokens_to_ids("<|vision_start|>") == config["vision_start_token_id"]
    assert len(tokenizer) <= config["text_config"]["vocab_size"]
    assert tokenizer.decode(tokenizer("a red fox", add_special_tokens=False)["input_ids"]) == "a red fox"
    processor = load_aux(h3_tiny, "processor")
    assert processor.image_processor.merge_size == processor.video_processor.merge_size == 2
    assert processor.video_processor.temporal_patch_size == 2  # the part a ref2va clip goes through


@pytest.mark.parametrize("name", ["tiny", "demo"])
def test_small_text_encoders_have_more_layers_than_the_conditioning_state(name: str):
    assert PROFILES[name].text_config["num_hidden_layers"] > HIDDEN_STATE_LAYER


def test_same_seed_writes_identical_bytes_and_another_seed_differs(h3_tiny: Path, tmp_path: Path):
    profile = get_profile("tiny")
    synth_h3(tmp_path / "same", profile, seed=0, components=["transformer"])
    synth_h3(tmp_path / "other", profile, seed=1, components=["transformer"])
    for file in (h3_tiny / "transformer").glob("*.safetensors"):
        assert (tmp_path / "same" / "transformer" / file.name).read_bytes() == file.read_bytes()
    a, b = _tensors(h3_tiny / "transformer"), _tensors(tmp_path / "other" / "transformer")
    assert not torch.equal(a["transformer_blocks.0.attn.to_q.weight"], b["transformer_blocks.0.attn.to_q.weight"])
    index = json.loads((tmp_path / "same" / "modular_model_index.json").read_text())
    assert "transformer" in index and "vae" not in index


def test_h3_dry_run_has_the_released_sizes(tmp_path: Path):
    report = synth_h3(tmp_path / "never", get_profile("h3"), dry_run=True)
    by_name = {c.name: c for c in report.components}
    dit = by_name["transformer"]
    assert (dit.tensors, dit.parameters) == (638, 33_122_992_896)
    assert dit.dtypes["float32"] > 0 and dit.bytes == 2 * dit.parameters + 2 * dit.dtypes["float32"] // 4
    assert round(by_name["text_encoder"].bytes / 2**30, 1) == 62.1
    assert round(by_name["vae"].parameters / 1e9, 1) == 2.6 and round(by_name["vae"].bytes / 2**30, 1) == 9.7
    assert round(by_name["audio_vae"].parameters / 1e9, 2) == 0.15
    assert not (tmp_path / "never").exists()


def test_pruned_r16_dry_run_is_the_seeds_layout(tmp_path: Path):
    [dit] = synth_h3(tmp_path / "never", get_profile("h3-pruned-r16"), dry_run=True).components
    assert (dit.name, dit.class_name, dit.tensors, dit.parameters) == ("transformer", None, 639, 20_166_101_760)
    assert round(dit.bytes / 2**30, 2) == 37.56


def test_pruned_r16_writes_fastvideos_names_and_no_class(tmp_path: Path):
    from models.synth.profiles import Profile

    small = Profile("pruned-small", "test", PROFILES["tiny"].transformer, components=("transformer",), adaln_rank=4)
    synth_h3(tmp_path / "p", small)
    folder = tmp_path / "p" / "transformer"
    tensors = _tensors(folder)
    assert tensors["adaln_basis.weight"].shape == (4, PROFILES["tiny"].transformer["time_embed_dim"])
    assert tensors["transformer_blocks.0.adaln_proj.linear.weight"].shape[1] == 4
    assert "transformer_blocks.0.ff.fc_in.weight" in tensors and "transformer_blocks.0.attn.to_out.weight" in tensors
    assert "_class_name" not in json.loads((folder / "config.json").read_text())
    assert json.loads((tmp_path / "p" / "modular_model_index.json").read_text())["transformer"][:2] == [None, None]


def test_progress_is_reported_on_the_calling_thread_up_to_the_total(tmp_path: Path):
    """Shards are written by several threads, but a Streamlit progress bar (the dashboard's first start)
    refuses calls from any thread but the script's: every report must come from the caller's thread."""
    import threading

    calls = []
    synth_h3(tmp_path / "tiny", get_profile("tiny"), on_bytes=lambda done, total: calls.append(
        (threading.current_thread(), done, total)))
    assert calls and {thread for thread, _, _ in calls} == {threading.current_thread()}
    done = [d for _, d, _ in calls]
    assert done == sorted(done) and done[-1] == calls[-1][2] > 0
