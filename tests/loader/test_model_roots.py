"""Every file the loader opens resolves under a model root, links resolved; an escape is refused
naming the entry, before the outside file is opened, and no message echoes a file's contents."""

from __future__ import annotations

import builtins
import json
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from core import CheckpointError
from loader import LoadOptions, discover_checkpoint, load_checkpoint
from loader.cli import main

REPO = Path(__file__).resolve().parents[2]
SECRET = b"root:x:0:0:root:/root:/bin/bash\n"


def _shard(path: Path, name: str = "w") -> Path:
    save_file({name: torch.arange(4, dtype=torch.float32)}, str(path))
    return path


def _component(folder: Path, *, index: bool) -> Path:
    folder.mkdir(parents=True)
    _shard(folder / "model-00001-of-00001.safetensors")
    (folder / "config.json").write_text(json.dumps({"_class_name": "Thing"}))
    if index:
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}})
        )
    return folder


def _model(root: Path, *, index: bool = True) -> Path:
    root.mkdir(parents=True)
    _component(root / "transformer", index=index)
    (root / "modular_model_index.json").write_text(json.dumps(
        {"_class_name": "MiniMaxH3ModularPipeline",
         "transformer": ["diffusers", "Thing", {"subfolder": "transformer", "type_hint": ["diffusers", "Thing"]}]}
    ))
    return root


def _relink(path: Path, target: Path) -> None:
    """Replace `path` (file or folder) by a symlink to `target`, which already holds a valid copy."""
    if path.is_dir():
        os.rename(path, target) if not target.exists() else None
    else:
        target.write_bytes(path.read_bytes())
        path.unlink()
    path.symlink_to(target)


def _set_index(root: Path, mutate) -> None:
    path = root / "modular_model_index.json"
    index = json.loads(path.read_text())
    mutate(index)
    path.write_text(json.dumps(index))


def _set_weight_map(root: Path, file: str) -> None:
    path = root / "transformer" / "model.safetensors.index.json"
    path.write_text(json.dumps({"weight_map": {"w": file}}))


# Each way the loader opens a file, made to escape: (id, build(root, outside) -> entry named in the error).
def _model_index_link(root, outside):
    _relink(root / "modular_model_index.json", outside / "modular_model_index.json")
    return "modular_model_index.json"


def _component_folder_link(root, outside):
    _relink(root / "transformer", outside / "comp")
    return "modular_model_index.json entry 'transformer'"


def _model_index_key(root, outside):
    _component(outside / "comp", index=True)
    rel = os.path.relpath(outside / "comp", root)  # "../../elsewhere/comp"
    _set_index(root, lambda i: i.update({rel: ["diffusers", "Thing"]}))
    return f"entry {rel!r}"


def _modular_subfolder(root, outside):
    _component(outside / "comp", index=True)
    rel = os.path.relpath(outside / "comp", root)
    _set_index(root, lambda i: i["transformer"][2].update(subfolder=rel))
    return f"entry 'transformer' (subfolder {rel!r})"


def _config_link(root, outside):
    _relink(root / "transformer" / "config.json", outside / "config.json")
    return "transformer/config.json"


def _index_file_link(root, outside):
    _relink(root / "transformer" / "model.safetensors.index.json", outside / "model.safetensors.index.json")
    return "transformer/model.safetensors.index.json"


def _weight_map_relative(root, outside):
    _shard(outside / "outside.safetensors")
    rel = os.path.relpath(outside / "outside.safetensors", root / "transformer")
    _set_weight_map(root, rel)
    return f"to {rel!r}"


def _weight_map_absolute(root, outside):
    _shard(outside / "outside.safetensors")
    _set_weight_map(root, str(outside / "outside.safetensors"))
    return f"to {str(outside / 'outside.safetensors')!r}"


def _indexed_shard_link(root, outside):
    _relink(root / "transformer" / "model-00001-of-00001.safetensors", outside / "shard.safetensors")
    return "to 'model-00001-of-00001.safetensors'"


def _globbed_shard_link(root, outside):
    (root / "transformer" / "model.safetensors.index.json").unlink()
    _relink(root / "transformer" / "model-00001-of-00001.safetensors", outside / "shard.safetensors")
    return "transformer/model-00001-of-00001.safetensors"


def _shard_through_folder_link(root, outside):
    (outside / "dir").mkdir()
    _shard(outside / "dir" / "inner.safetensors")
    (root / "transformer" / "sub").symlink_to(outside / "dir")
    _set_weight_map(root, "sub/inner.safetensors")
    return "to 'sub/inner.safetensors'"


ESCAPES = [
    _model_index_link, _component_folder_link, _model_index_key, _modular_subfolder, _config_link,
    _index_file_link, _weight_map_relative, _weight_map_absolute, _indexed_shard_link, _globbed_shard_link,
    _shard_through_folder_link,
]


@pytest.fixture
def opened(monkeypatch) -> list[Path]:
    """Real paths of every file opened through open() or os.open() during the test."""
    seen: list[Path] = []
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)):
            seen.append(Path(os.path.realpath(file)))
        return real_open(file, *args, **kwargs)

    def spy_os_open(file, *args, **kwargs):
        seen.append(Path(os.path.realpath(file)))
        return real_os_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    return seen


@pytest.mark.parametrize("escape", ESCAPES, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("entry_point", ["discover", "discover_unvalidated", "load"])
def test_any_file_resolving_outside_the_roots_is_refused_before_it_is_opened(tmp_path, escape, entry_point, opened):
    root = _model(tmp_path / "models" / "h3")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    entry = escape(root, outside)
    opened.clear()
    with pytest.raises(CheckpointError) as err:
        if entry_point == "discover":
            discover_checkpoint(root)
        elif entry_point == "discover_unvalidated":
            discover_checkpoint(root, validate=False)
        else:
            load_checkpoint(root, LoadOptions(component="transformer", roots=[tmp_path / "models"]))
    message = str(err.value)
    assert "resolves outside the model roots" in message and entry in message
    real_outside = Path(os.path.realpath(outside))
    assert not [p for p in opened if real_outside in p.parents], "an outside file was opened"


@pytest.mark.parametrize("escape", ESCAPES, ids=lambda f: f.__name__.strip("_"))
def test_the_same_layout_loads_when_the_outside_folder_is_a_root_too(tmp_path, escape):
    """The refusal is about the roots, not the layout: naming the other folder a root allows it."""
    root = _model(tmp_path / "models" / "h3")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    escape(root, outside)
    index = discover_checkpoint(root, roots=[root, outside])
    assert sum(c.tensor_count for c in index.components.values()) >= 1


def test_an_index_pointing_at_a_system_file_never_echoes_its_bytes(tmp_path):
    root = _model(tmp_path / "models" / "h3")
    secret = tmp_path / "passwd"
    secret.write_bytes(SECRET)
    _set_weight_map(root, os.path.relpath(secret, root / "transformer"))
    (prefix,) = struct.unpack("<Q", SECRET[:8])
    for roots in (None, [root, tmp_path]):  # refused by the roots; inside them, still not echoed
        with pytest.raises(CheckpointError) as err:
            discover_checkpoint(root, roots=roots)
        message = str(err.value).replace(str(tmp_path), "<tmp>")  # pytest's folder numbers (pytest-323) hold digits
        assert str(prefix) not in message and "root:x" not in message and str(len(SECRET)) not in message


def test_a_lone_file_or_folder_outside_explicit_roots_is_refused(tmp_path):
    shard = _shard(tmp_path / "elsewhere.safetensors")
    (tmp_path / "models").mkdir()
    with pytest.raises(CheckpointError, match="resolves outside the model roots"):
        discover_checkpoint(shard, roots=[tmp_path / "models"])
    (tmp_path / "models" / "link.safetensors").symlink_to(shard)
    with pytest.raises(CheckpointError, match="resolves outside the model roots"):
        load_checkpoint(tmp_path / "models" / "link.safetensors", LoadOptions(roots=[tmp_path / "models"]))


def test_the_cli_refuses_with_exit_2_naming_the_entry(tmp_path, capsys):
    root = _model(tmp_path / "models" / "h3")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    _weight_map_relative(root, outside)
    assert main(["inspect", str(root), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and "resolves outside the model roots" in out["error"]
    assert main(["load", str(root), "--root", str(tmp_path / "models")]) == 2
    assert "outside.safetensors" in capsys.readouterr().err
    assert main(["inspect", str(root), "--root", str(root), "--root", str(outside), "--json"]) == 0
