"""Every malformed checkpoint gets one clear error naming the file and tensor, before any byte is read."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from core import CheckpointError
from loader import LoadOptions, discover_checkpoint, load_checkpoint


def write_raw(path: Path, header: dict | bytes, data: bytes = b"", *, length: int | None = None) -> Path:
    """A hand-built safetensors file: u64 header length, header, data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def problem_for(path: Path) -> str:
    with pytest.raises(CheckpointError) as err:
        discover_checkpoint(path)
    return str(err.value)


def test_a_sound_single_file_is_described_from_its_header(tmp_path):
    path = write_raw(tmp_path / "ok.safetensors", {"a": entry("F32", [2, 2], 0, 16), "b": entry("BF16", [3], 16, 22)}, bytes(22))
    index = discover_checkpoint(path)
    component = index.component()
    assert index.layout == "file" and component.name == "ok"
    a = component.tensors[0]
    assert (a.name, a.shape, a.dtype, a.nbytes, a.file) == ("a", (2, 2), "F32", 16, path)
    assert a.offset == 8 + len(json.dumps({"a": entry("F32", [2, 2], 0, 16), "b": entry("BF16", [3], 16, 22)}))
    assert component.total_bytes == 22 and component.dtype_bytes() == {"BF16": 6, "F32": 16}


def test_a_file_too_short_for_a_header_length_is_reported(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x01\x02")
    assert "short.safetensors: file is 2 bytes, too short" in problem_for(path)


def test_an_absurd_header_length_is_refused_before_reading_it(tmp_path):
    path = write_raw(tmp_path / "huge.safetensors", b"{}", length=1 << 40)
    message = problem_for(path)
    assert "huge.safetensors: header length exceeds the 104857600-byte limit" in message
    assert str(1 << 40) not in message  # the length field is the file's bytes: never echoed


def test_a_header_running_past_the_end_of_the_file_is_truncation(tmp_path):
    path = write_raw(tmp_path / "cut.safetensors", b'{"a": 1', length=500)
    assert "cut.safetensors: header length runs past the end of the 15-byte file (truncated?)" in problem_for(path)


def test_a_header_that_is_not_json_is_reported(tmp_path):
    path = write_raw(tmp_path / "bad.safetensors", b"{not json}")
    assert "bad.safetensors: header is not valid JSON" in problem_for(path)


def test_an_unknown_dtype_names_the_tensor_and_the_known_dtypes(tmp_path):
    path = write_raw(tmp_path / "d.safetensors", {"w": entry("Q4", [4], 0, 2)}, bytes(2))
    assert "d.safetensors: tensor 'w' has unknown dtype 'Q4'; known: BF16" in problem_for(path)


def test_offsets_past_the_data_area_mean_a_truncated_file(tmp_path):
    path = write_raw(tmp_path / "t.safetensors", {"w": entry("F32", [4], 0, 16)}, bytes(10))
    assert "t.safetensors: tensor 'w' has data_offsets [0, 16] past the end of the 10-byte data area" in problem_for(path)


def test_overlapping_tensors_are_both_named(tmp_path):
    path = write_raw(tmp_path / "o.safetensors", {"a": entry("F32", [4], 0, 16), "b": entry("F32", [4], 8, 24)}, bytes(24))
    assert "o.safetensors: tensors 'a' [0, 16] and 'b' [8, 24] overlap" in problem_for(path)


def test_shape_times_dtype_must_equal_the_byte_span(tmp_path):
    path = write_raw(tmp_path / "s.safetensors", {"w": entry("BF16", [3, 3], 0, 16)}, bytes(16))
    assert "s.safetensors: tensor 'w' has shape (3, 3) x BF16 = 18 bytes, but its data_offsets span 16 bytes" in problem_for(path)


def test_a_malformed_entry_names_the_field(tmp_path):
    path = write_raw(tmp_path / "e.safetensors", {"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4))
    assert "e.safetensors: tensor 'w': shape is [-1], expected a list of non-negative integers" in problem_for(path)


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ([1], "entry is not an object"),
        ({"dtype": 3, "shape": [1], "data_offsets": [0, 4]}, "dtype is 3, expected a string"),
        ({"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}, "shape is [True], expected a list of non-negative integers"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0, False]}, "data_offsets is [0, False], expected [begin, end]"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0, 4.0]}, "data_offsets is [0, 4.0], expected [begin, end]"),
    ],
)
def test_each_malformed_field_is_named_and_json_booleans_are_not_integers(tmp_path, entry, said):
    path = write_raw(tmp_path / "f.safetensors", {"w": entry}, bytes(4))
    assert f"f.safetensors: tensor 'w': {said}" in problem_for(path)


def test_every_problem_is_listed_in_one_error(tmp_path):
    path = write_raw(
        tmp_path / "many.safetensors",
        {"a": entry("Q4", [1], 0, 1), "b": entry("F32", [4], 0, 16), "c": entry("F32", [1], 16, 20)},
        bytes(12),
    )
    message = problem_for(path)
    assert message.startswith("4 problems:")
    assert "'a' has unknown dtype" in message and "'b' [0, 16] overlap" in message and "'c' has data_offsets" in message


def _sharded(tmp_path: Path) -> Path:
    folder = tmp_path / "comp"
    folder.mkdir()
    save_file({"a": torch.ones(2) + 1}, str(folder / "m-1.safetensors"))
    save_file({"b": torch.ones(3) + 2}, str(folder / "m-2.safetensors"))
    return folder


def _write_index(folder: Path, weight_map: dict) -> None:
    (folder / "m.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_an_index_naming_a_missing_shard_names_tensor_and_folder(tmp_path):
    folder = _sharded(tmp_path)
    _write_index(folder, {"a": "m-1.safetensors", "b": "m-2.safetensors", "c": "m-9.safetensors"})
    assert f"m.safetensors.index.json maps 'c' to 'm-9.safetensors', which is not in {folder}" in problem_for(folder)


def test_an_index_that_disagrees_with_the_headers_is_reported_both_ways(tmp_path):
    folder = _sharded(tmp_path)
    _write_index(folder, {"a": "m-2.safetensors", "z": "m-1.safetensors"})
    message = problem_for(folder)
    assert "maps 'a' to m-2.safetensors, but the tensor is in m-1.safetensors" in message
    assert "maps 'z' to m-1.safetensors, but the tensor is in no shard header" in message
    assert "m-2.safetensors holds 'b', which m.safetensors.index.json does not list" in message


def test_an_index_that_is_not_json_is_reported(tmp_path):
    folder = _sharded(tmp_path)
    (folder / "m.safetensors.index.json").write_text("{oops")
    assert "m.safetensors.index.json: not valid JSON" in problem_for(folder)


def test_a_tensor_in_two_shards_is_a_duplicate(tmp_path):
    folder = tmp_path / "dup"
    folder.mkdir()
    save_file({"a": torch.ones(2)}, str(folder / "m-1.safetensors"))
    save_file({"a": torch.ones(2)}, str(folder / "m-2.safetensors"))
    assert "tensor 'a' appears in both m-1.safetensors and m-2.safetensors" in problem_for(folder)


def test_a_missing_path_is_one_line(tmp_path):
    assert problem_for(tmp_path / "nowhere") == f"{tmp_path / 'nowhere'}: no such file or directory"


def test_a_model_folder_lists_its_components_and_picks_one_by_name(tmp_path, tiny_checkpoint):
    root = tmp_path / "model"
    root.mkdir()
    (root / "model_index.json").write_text(json.dumps({"_class_name": "Pipe", "transformer": ["x", "Y"], "vae": ["x", "Z"], "scheduler": ["x", "S"]}))
    (root / "scheduler").mkdir()
    for name in ("transformer", "vae"):
        (root / name).symlink_to(tiny_checkpoint.path)
    roots = [root, tiny_checkpoint.path]  # the links leave the model folder: allowed only when both are roots
    index = discover_checkpoint(root, roots=roots)
    assert index.layout == "model" and list(index.components) == ["transformer", "vae"]
    assert index.component().name == "transformer"
    with pytest.raises(CheckpointError, match="has no component 'text_encoder'; known: transformer, vae"):
        index.component("text_encoder")
    module, report = load_checkpoint(root, LoadOptions(component="vae", roots=roots))
    assert report.tensors_placed == len(tiny_checkpoint.tensors)


def test_a_truncated_shard_fails_the_load_before_placing_anything(tmp_path, tiny_checkpoint, component_writer):
    folder = component_writer(tiny_checkpoint.shards)
    shard = folder / "model-00002-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="model-00002-of-00003.safetensors: tensor '.*' has data_offsets .* past the end"):
        load_checkpoint(folder)
