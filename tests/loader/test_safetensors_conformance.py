"""The header reader refuses what the `safetensors` reference implementation refuses, and accepts what it
accepts: each case below is checked against `safetensors.safe_open` itself, so a change on either side shows."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from core import CheckpointError
from loader import discover_checkpoint, load_checkpoint
from loader.dtypes import SAFETENSORS_DTYPES

F32 = '{"dtype":"F32","shape":[1],"data_offsets":[%s,%s]}'


def write_raw(path: Path, header: str, data: bytes) -> Path:
    """A hand-built file: the header as written (a dict could not hold a duplicate key or `-0`)."""
    raw = header.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def reference_reads(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


HOSTILE = {
    # name: (header, data bytes, what our one line must say)
    "gap between tensors": (
        '{"a":%s,"b":%s}' % (F32 % (0, 4), F32 % (8, 12)), 12,
        "4 bytes between tensor 'a' [0, 4] and tensor 'b' [8, 12] belong to no tensor",
    ),
    "gap before the first tensor": ('{"a":%s}' % (F32 % (4, 8)), 8, "4 bytes between the start of the data area and tensor 'a'"),
    "trailing bytes": ('{"a":%s}' % (F32 % (0, 4)), 8, "4 bytes after the last tensor's data belong to no tensor"),
    "non-string metadata value": ('{"__metadata__":{"format":1},"a":%s}' % (F32 % (0, 4)), 4, "__metadata__ 'format' is not a string but a number"),
    "metadata shaped like a tensor": (
        '{"__metadata__":{"dtype":"F32","data_offsets":[0,4]},"a":%s}' % (F32 % (0, 4)), 4,
        "__metadata__ 'data_offsets' is not a string but a list",
    ),
    "metadata a list": ('{"__metadata__":[],"a":%s}' % (F32 % (0, 4)), 4, "__metadata__ is not an object of strings but a list"),
    "duplicate tensor": ('{"a":%s,"a":%s}' % (F32 % (0, 4), F32 % (4, 8)), 8, "header is ambiguous: it gives the key 'a' twice"),
    "duplicate field": ('{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 4, "gives the key 'dtype' twice"),
    "duplicate metadata": ('{"__metadata__":{},"__metadata__":{},"a":%s}' % (F32 % (0, 4)), 4, "gives the key '__metadata__' twice"),
    "-0 as an offset": ('{"a":%s}' % (F32 % ("-0", 4)), 4, "tensor 'a': data_offsets is [-0.0, 4], expected [begin, end]"),
    "-0 as a dimension": ('{"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}}', 0, "tensor 'a': shape is [-0.0], expected a list"),
    "overlapping equal spans": ('{"a":%s,"b":%s}' % (F32 % (0, 4), F32 % (0, 4)), 4, "tensors 'a' [0, 4] and 'b' [0, 4] overlap"),
    "an empty tensor inside another": (
        '{"a":%s,"e":{"dtype":"F32","shape":[0],"data_offsets":[2,2]}}' % (F32 % (0, 4)), 4,
        "tensors 'a' [0, 4] and 'e' [2, 2] overlap",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_file_safetensors_refuses_is_refused_in_one_line_naming_it(tmp_path, case):
    header, data, said = HOSTILE[case]
    path = write_raw(tmp_path / "hostile.safetensors", header, bytes(data))
    with pytest.raises(Exception):
        reference_reads(path)
    with pytest.raises(CheckpointError) as err:
        discover_checkpoint(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith("hostile.safetensors: ") and said in message


def test_the_trailing_bytes_check_waits_for_a_sound_header(tmp_path):
    """A refused entry's bytes are unaccounted for: its one line is the problem, not "trailing bytes"."""
    path = write_raw(tmp_path / "e.safetensors", '{"a":%s,"b":%s}' % (F32 % (0, 4), F32 % (4, "4.0")), bytes(8))
    with pytest.raises(CheckpointError) as err:
        discover_checkpoint(path)
    assert str(err.value) == "e.safetensors: tensor 'b': data_offsets is [4, 4.0], expected [begin, end] non-negative integers"


def _every_dtype(path: Path) -> Path:
    tensors = {}
    for name, dtype in SAFETENSORS_DTYPES.items():
        values = torch.arange(-3, 3, dtype=torch.float32).reshape(2, 3)
        tensors[name] = values.to(dtype) if dtype != torch.bool else values > 0
    save_file(tensors, str(path))
    return path


VALID = {
    "every dtype": _every_dtype,
    "0-dim and empty tensors": lambda p: save_file(
        {"scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3), "also_empty": torch.zeros(4, 0, dtype=torch.bfloat16)}, str(p)
    ) or p,
    "offsets not 8-byte aligned": lambda p: write_raw(
        p, '{"b":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"w":%s}' % (F32 % (3, 7)), bytes(7)
    ),
    "header order unlike the data's": lambda p: write_raw(p, '{"z":%s,"a":%s}' % (F32 % (0, 4), F32 % (4, 8)), bytes(8)),
    "metadata null": lambda p: write_raw(p, '{"__metadata__":null,"a":%s}' % (F32 % (0, 4)), bytes(4)),
    "metadata of strings": lambda p: write_raw(p, '{"__metadata__":{"format":"pt"},"a":%s}' % (F32 % (0, 4)), bytes(4)),
    "no tensors at all": lambda p: write_raw(p, "{}", b""),
    "an empty tensor at the end": lambda p: write_raw(
        p, '{"a":%s,"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}' % (F32 % (0, 4)), bytes(4)
    ),
    "header padded with spaces": lambda p: write_raw(p, '{"a":%s}   ' % (F32 % (0, 4)), bytes(4)),
    "-0 inside a name": lambda p: write_raw(p, '{"layer-0":%s}' % (F32 % (0, 4)), bytes(4)),
}


@pytest.mark.parametrize("case", list(VALID))
def test_a_file_safetensors_reads_is_read_alike(tmp_path, case):
    path = VALID[case](tmp_path / "edge.safetensors")
    expected = reference_reads(path)
    index = discover_checkpoint(path)
    assert sorted(t.name for t in index.component().tensors) == sorted(expected)
    if not expected:
        return
    module, _ = load_checkpoint(path)
    loaded = dict(module.state_dict())
    for name, tensor in expected.items():
        got = loaded[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape
        assert _bytes(got) == _bytes(tensor)


def _bytes(tensor: torch.Tensor) -> list[int]:
    return tensor.reshape(-1).contiguous().view(torch.uint8).tolist()
