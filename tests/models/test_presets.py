"""Few-step presets as data: the shipped file's entries, a preset's fields filling what a request leaves unset, its
LoRA found by file name under the model roots, and a bad file or a missing LoRA refused in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from models.request.params import GenerateParams
from models.request.presets import PresetError, get_preset, read_presets, with_preset

from .lora_files import write_peft_lora


def _presets(tmp_path: Path, *entries: dict) -> Path:
    path = tmp_path / "presets.json"
    path.write_text(json.dumps(list(entries)))
    return path


def test_every_shipped_preset_reads_and_an_n_step_name_runs_n_steps():
    presets = read_presets()
    assert "lightx2v 8-step" in presets
    for preset in presets.values():
        named = re.search(r"(\d+)-step", preset.name)
        assert named is None or preset.steps == int(named.group(1)), preset
        assert preset.source, f"{preset.name}: say whose figures these are"


def test_a_preset_fills_steps_shift_and_its_lora_found_under_the_roots_and_given_values_win(h3_tiny, tmp_path):
    root = tmp_path / "models"
    (root / "loras").mkdir(parents=True)
    lora = write_peft_lora(root / "loras" / "turbo8.safetensors", h3_tiny, modules=["proj_out"])
    path = _presets(tmp_path, {"name": "turbo", "steps": 8, "shift": 5.0, "lora": "turbo8.safetensors", "scale": 0.8})
    filled = with_preset(GenerateParams(prompt="a fox"), "turbo", [root], path)
    assert (filled.steps, filled.shift) == (8, 5.0)
    assert [(Path(x.file), x.scale) for x in filled.loras] == [(lora, 0.8)]
    given = with_preset(GenerateParams(prompt="a fox", steps=4, shift=2.0), "turbo", [root], path)
    assert (given.steps, given.shift) == (4, 2.0) and len(given.loras) == 1


def test_a_missing_lora_file_or_unknown_name_is_refused_naming_where_it_looked(tmp_path):
    path = _presets(tmp_path, {"name": "turbo", "steps": 8, "lora": "turbo8.safetensors"})
    with pytest.raises(PresetError, match=rf"preset 'turbo': no LoRA file 'turbo8.safetensors' under {tmp_path}"):
        with_preset(GenerateParams(prompt="a fox"), "turbo", [tmp_path], path)
    with pytest.raises(PresetError, match="no preset 'fast'; known: 'turbo'"):
        get_preset("fast", path)


@pytest.mark.parametrize("entry, message", [
    ({"name": "x", "steps": 1}, "steps must be an integer in 2..1000"),
    ({"name": "x", "shift": -1}, "shift -1 is outside"),
    ({"name": "x", "lora": "../up/turbo.safetensors"}, "lora must be a .safetensors file name"),
    ({"name": "x", "scale": "big"}, "scale must be a finite number"),
    ({"name": "x", "colour": "red"}, "unknown field(s) 'colour'"),
    ({"steps": 8}, "name must be a non-empty string"),
])
def test_a_malformed_preset_is_refused_naming_the_file_and_the_field(tmp_path, entry, message):
    path = _presets(tmp_path, entry)
    with pytest.raises(PresetError) as e:
        read_presets(path)
    assert str(path) in str(e.value) and message in str(e.value)
