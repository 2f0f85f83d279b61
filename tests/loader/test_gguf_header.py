"""A GGUF header read with bounds and no dependency: names, types, shapes and bytes right, and every corrupt
or crafted header refused in one line naming the file and what was wrong."""

from __future__ import annotations

import struct

import pytest

from core.errors import CheckpointError
from loader.gguf_header import QUANT_TYPES, read_gguf_header
from tests.loader.gguf_files import gguf_bytes, require_gguf, write

TENSORS = [("blocks.0.attn.qkv_proj.weight", (96, 32), "Q8_0"), ("blocks.0.norm1.weight", (32,), "F32"),
           ("final_layer.video_out.weight", (16, 256), "Q4_K")]


def test_names_types_torch_shapes_and_bytes_come_from_the_header(tmp_path):
    file = write(tmp_path / "dit.gguf", gguf_bytes(TENSORS))
    header = read_gguf_header(file)
    assert [(t.name, t.quant_type, t.shape, t.nbytes) for t in header.tensors] == [
        ("blocks.0.attn.qkv_proj.weight", "Q8_0", (96, 32), 96 * 34),
        ("blocks.0.norm1.weight", "F32", (32,), 128),
        ("final_layer.video_out.weight", "Q4_K", (16, 256), 16 * 144),
    ]
    assert header.version == 3 and header.data_start % 32 == 0
    assert header.tensors[0].offset == header.data_start
    assert header.bytes_by_type() == {"Q8_0": 96 * 34, "Q4_K": 16 * 144, "F32": 128}


def _refusal(tmp_path, data: bytes, name: str = "dit.gguf") -> str:
    with pytest.raises(CheckpointError) as refused:
        read_gguf_header(write(tmp_path / name, data))
    message = str(refused.value)
    assert "\n" not in message and message.startswith(name + ": ")
    return message


def test_a_truncated_header_is_refused_naming_where_it_ended(tmp_path):
    whole = gguf_bytes(TENSORS)
    assert "truncated GGUF header: the file ends at byte 2 inside the magic" in _refusal(tmp_path, whole[:2])
    assert "inside the counts" in _refusal(tmp_path, whole[:12])
    infos = whole.index(b"blocks.0.norm1")
    assert "inside tensor info 1" in _refusal(tmp_path, whole[:infos + 10])
    assert "inside tensor blocks.0.norm1.weight" in _refusal(tmp_path, whole[:infos + 30])


def test_truncated_data_is_refused_naming_the_tensor_past_the_end(tmp_path):
    whole = gguf_bytes(TENSORS)
    message = _refusal(tmp_path, whole[:-100])
    assert "truncated: tensor final_layer.video_out.weight (Q4_K (16, 256)) ends at byte" in message


def test_a_gguf_named_file_that_is_not_gguf_says_what_it_starts_with(tmp_path):
    assert _refusal(tmp_path, b"\x08\x00\x00\x00\x00\x00\x00\x00{}") == (
        "dit.gguf: not a GGUF file (it starts with b'\\x08\\x00\\x00\\x00', not b'GGUF'); a .gguf file must be GGUF")
    assert "GGUF version 1; versions 2 and 3 are read" in _refusal(tmp_path, gguf_bytes(TENSORS, version=1))


def test_crafted_counts_lengths_and_shapes_are_refused_before_any_allocation(tmp_path):
    many = b"GGUF" + struct.pack("<IQQ", 3, 2**60, 0)
    assert "claims 1,152,921,504,606,846,976 tensors" in _refusal(tmp_path, many)
    long_key = b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**62)
    assert "truncated GGUF header" in _refusal(tmp_path, long_key)
    five = gguf_bytes([("x", (1, 1, 1, 1, 32), "F32")])
    assert "tensor x has 5 dimensions; GGUF allows 1 to 4" in _refusal(tmp_path, five)
    rows = gguf_bytes([("x", (4, 32), "F32")])
    rows = rows.replace(struct.pack("<QQI", 32, 4, 0), struct.pack("<QQI", 32, 4, 8))  # F32 -> Q8_0, 32 values a row
    assert read_gguf_header(write(tmp_path / "ok.gguf", rows)).tensors[0].quant_type == "Q8_0"
    odd = gguf_bytes([("x", (4, 32), "F32")]).replace(struct.pack("<QQI", 32, 4, 0), struct.pack("<QQI", 40, 4, 8))
    assert "tensor x: Q8_0 packs 32 values per block, but its rows hold 40" in _refusal(tmp_path, odd)


def test_offsets_must_be_aligned_and_tensors_must_not_overlap(tmp_path):
    two = [("a", (32,), "F32"), ("b", (32,), "F32")]
    whole = gguf_bytes(two)
    b_info = whole.index(b"\x01\x00\x00\x00\x00\x00\x00\x00b") + 9
    offset_at = b_info + 4 + 8 + 4
    misaligned = whole[:offset_at] + struct.pack("<Q", 4) + whole[offset_at + 8:]
    assert "tensor b starts at data offset 4, not a multiple of the alignment 32" in _refusal(tmp_path, misaligned)
    overlapping = whole[:offset_at] + struct.pack("<Q", 0) + whole[offset_at + 8:]
    assert "overlaps" in _refusal(tmp_path, overlapping)
    assert "general.alignment 3 is not a power of two" in _refusal(tmp_path, gguf_bytes(two, alignment=3))


def test_the_type_table_is_the_gguf_package_s_own():
    gguf = require_gguf()
    for type_id, (name, block, size) in QUANT_TYPES.items():
        kind = gguf.GGMLQuantizationType(type_id)
        assert (kind.name, *gguf.GGML_QUANT_SIZES[kind]) == (name, block, size)


def test_the_header_agrees_with_the_gguf_package_s_reader(tmp_path):
    gguf = require_gguf()
    import numpy as np

    writer = gguf.GGUFWriter(str(tmp_path / "w.gguf"), arch="minimax_h3")
    writer.add_string("tokenizer.note", "x" * 1000)
    writer.add_array("some.scores", [0.5] * 300)
    values = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    packed = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("w", packed, raw_shape=packed.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("b", values[0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = read_gguf_header(tmp_path / "w.gguf").tensors
    theirs = gguf.GGUFReader(str(tmp_path / "w.gguf")).tensors
    assert [(t.name, t.quant_type, t.offset, t.nbytes) for t in ours] == [
        (t.name, t.tensor_type.name, t.data_offset, t.n_bytes) for t in theirs]
    assert [t.shape for t in ours] == [(64, 32), (32,)]
