"""The H3 profiles reproduce the published DiT shapes, computed from the spec alone."""

from __future__ import annotations

import torch

from models.config import PROFILES, DiTConfig, get_profile
from models.dit import H3Transformer3DModel
from models.synth import component_specs


def _counts(cfg: DiTConfig) -> tuple[int, int, dict[str, tuple[int, ...]]]:
    with torch.device("meta"):
        state = H3Transformer3DModel(cfg).state_dict()
    return len(state), sum(t.numel() for t in state.values()), {k: tuple(v.shape) for k, v in state.items()}


def test_pruned_r16_dit_has_639_tensors_and_20_166_101_760_parameters():
    tensors, params, shapes = _counts(get_profile("h3-pruned-r16").transformer)
    assert (tensors, params) == (639, 20_166_101_760)
    assert shapes["adaln_basis.weight"] == (16, 2688)
    assert shapes["transformer_blocks.49.adaln_proj.linear.weight"] == (96768, 16)
    assert round(params * 2 / 2**30, 2) == 37.56


def test_full_dit_has_638_tensors_and_33_122_992_896_parameters():
    tensors, params, shapes = _counts(get_profile("h3-full").transformer)
    assert (tensors, params) == (638, 33_122_992_896)
    assert "adaln_basis.weight" not in shapes
    assert round(params * 2 / 2**30, 1) == 61.7


def test_full_dit_shapes_match_the_published_layout():
    _, _, shapes = _counts(get_profile("h3-full").transformer)
    assert shapes["transformer_blocks.7.attn.to_q.weight"] == (7168, 5376)
    assert shapes["transformer_blocks.7.attn.to_out.weight"] == (5376, 7168)
    assert shapes["transformer_blocks.7.attn.norm_q.weight"] == (128,)
    assert shapes["transformer_blocks.7.ff.fc_in.weight"] == (28672, 5376)
    assert shapes["transformer_blocks.7.ff.fc_out.weight"] == (5376, 14336)
    assert shapes["transformer_blocks.7.adaln_proj.linear.weight"] == (96768, 2688)
    assert shapes["proj_in.weight"] == (5376, 96)
    assert shapes["context_embedder.weight"] == (5376, 5120)
    assert shapes["token_refiner.refiner_blocks.1.ff.fc_in.weight"] == (28672, 5376)
    assert sum(k.startswith("transformer_blocks.") for k in shapes) == 50 * 12


def test_every_profile_config_round_trips_through_config_json():
    for profile in PROFILES.values():
        for cfg in profile.components().values():
            assert type(cfg).from_json(cfg.to_json()) == cfg


def test_component_specs_match_the_module_in_order():
    cfg = get_profile("tiny").transformer
    specs = component_specs(cfg, torch.bfloat16)
    assert [s.name for s in specs] == list(H3Transformer3DModel(cfg).state_dict())
    assert all(s.dtype == torch.bfloat16 for s in specs)
