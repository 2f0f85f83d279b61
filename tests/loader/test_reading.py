"""Positioned reads into fresh memory: the bytes land exactly, and pre-faulting really faults in."""

from __future__ import annotations

import os

import torch

from loader.memory import sample_memory
from loader.reading import byte_view, populate, read_into_fresh


def test_read_into_fresh_fills_an_untouched_tensor_with_the_file_bytes(tmp_path):
    data = torch.randint(0, 256, (3 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(7))
    path = tmp_path / "bytes.bin"
    path.write_bytes(b"pad" + data.numpy().tobytes())
    dest = torch.empty(3 << 20, dtype=torch.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_into_fresh(fd, 3, byte_view(dest), name="bytes.bin") == dest.numel()
    finally:
        os.close(fd)
    assert torch.equal(dest, data)


def test_populate_faults_a_fresh_buffer_in_before_it_is_written():
    size = 64 << 20
    buffer = torch.empty(size, dtype=torch.uint8)
    before = sample_memory().rss_anon
    assert populate(byte_view(buffer))
    assert sample_memory().rss_anon - before >= size * 0.9
