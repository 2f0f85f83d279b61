"""Every JSON the loader parses is bounded in size and nesting: a crafted file ends in one
CheckpointError naming it (CLI: exit 2, one line), never a RecursionError or a traceback."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import core.jsonfile as jsonfile
from core import CheckpointError
from loader import discover_checkpoint

REPO = Path(__file__).resolve().parents[2]
DEEP = "[" * 200_000 + "]" * 200_000


def _model(root: Path) -> Path:
    (root / "transformer").mkdir(parents=True)
    save_file({"w": torch.ones(2)}, str(root / "transformer" / "model-00001-of-00001.safetensors"))
    (root / "transformer" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}})
    )
    (root / "transformer" / "config.json").write_text("{}")
    (root / "model_index.json").write_text(json.dumps({"transformer": ["diffusers", "X"]}))
    return root


def _deep_header(path: Path) -> None:
    raw = DEEP.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


WHERE = {
    "shard header": ("transformer/model-00001-of-00001.safetensors", _deep_header),
    "config.json": ("transformer/config.json", lambda p: p.write_text(DEEP)),
    "index": ("transformer/model.safetensors.index.json", lambda p: p.write_text(DEEP)),
    "model index": ("model_index.json", lambda p: p.write_text(DEEP)),
    "nested object": ("transformer/config.json", lambda p: p.write_text('{"a":' * 100 + "1" + "}" * 100)),
}


@pytest.mark.parametrize("where", list(WHERE))
def test_a_200000_deep_json_is_a_checkpoint_error_naming_the_file(tmp_path, where):
    root = _model(tmp_path / "m")
    relative, write = WHERE[where]
    write(root / relative)
    with pytest.raises(CheckpointError) as err:
        discover_checkpoint(root)
    assert f"{Path(relative).name}: " in str(err.value) and "nested deeper than 64 levels" in str(err.value)


def test_inspect_on_a_deep_header_exits_2_with_one_line(tmp_path):
    shard = tmp_path / "deep.safetensors"
    _deep_header(shard)
    result = subprocess.run(
        [sys.executable, "-m", "loader", "inspect", str(shard)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: deep.safetensors: header is JSON nested deeper than 64 levels")


def test_an_oversized_side_file_is_refused_without_reading_it_all(tmp_path, monkeypatch):
    root = _model(tmp_path / "m")
    monkeypatch.setattr(jsonfile, "MAX_JSON_BYTES", 1000)
    (root / "transformer" / "config.json").write_text(json.dumps({"pad": "x" * 2000}))
    with pytest.raises(CheckpointError, match="config.json: larger than the 1000-byte limit for a JSON file"):
        discover_checkpoint(root)


def test_invalid_utf8_is_named_without_echoing_the_bytes(tmp_path):
    root = _model(tmp_path / "m")
    (root / "transformer" / "config.json").write_bytes(b'{"a": "\xfe\xff"}')
    with pytest.raises(CheckpointError) as err:
        discover_checkpoint(root)
    assert "config.json: not valid UTF-8 (byte 7)" in str(err.value) and "xfe" not in str(err.value)
