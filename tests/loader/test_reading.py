"""Positioned reads: the bytes land exactly, pre-faulting really faults in, read-ahead advice really
fetches, and the stream placement's staging pipeline gives exact tensors."""

from __future__ import annotations

import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from loader import LoadOptions, load_checkpoint
from core.errors import PlacementError
from machine.memory import sample_memory
from loader.placement import get_placement
from loader.io.pagecache import resident_pages
from loader.io.reading import advice_step, advise_willneed, byte_view, populate, read_into_fresh, submit_parts


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
    if not populate(byte_view(buffer)):
        pytest.skip(f"this kernel ({os.uname().release}) has no MADV_POPULATE_WRITE (Linux >= 5.14): reads fault as usual")
    assert sample_memory().rss_anon - before >= size * 0.9


def test_submit_parts_splits_a_read_over_the_pool_and_the_parts_land_in_place(tmp_path):
    data = torch.randint(0, 256, (9 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    path = tmp_path / "bytes.bin"
    path.write_bytes(b"x" * 5 + data.numpy().tobytes())
    dest = torch.zeros(9 << 20, dtype=torch.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(3) as pool:
            futures = submit_parts(fd, 5, dest, pool, parts=3)
            assert len(futures) == 3
            for f in futures:
                f.result()
        inline = torch.zeros(1 << 20, dtype=torch.uint8)
        assert submit_parts(fd, 5, inline, None, parts=3) == []
    finally:
        os.close(fd)
    assert torch.equal(dest, data)
    assert torch.equal(inline, data[: 1 << 20])


def _resident_bytes(fd: int, size: int) -> int:
    """How much of the first `size` bytes of `fd` sits in the page cache."""
    return resident_pages(fd, 0, size)[0] * mmap.PAGESIZE


def test_advise_willneed_pulls_an_evicted_range_into_the_page_cache(tmp_path):
    size = 16 << 20
    path = tmp_path / "cold.bin"
    path.write_bytes(os.urandom(size))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        evicted = _resident_bytes(fd, size)
        if evicted > size // 2:
            pytest.skip(f"{tmp_path} keeps file pages resident after POSIX_FADV_DONTNEED (tmpfs?)")
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        advise_willneed(fd, 0, size, advice_step(fd))
        deadline = time.monotonic() + 10
        while _resident_bytes(fd, size) < size and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _resident_bytes(fd, size) == size
    finally:
        os.close(fd)


def test_advice_step_is_a_whole_number_of_pages_between_4_KiB_and_2_MiB(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        step = advice_step(fd)
    finally:
        os.close(fd)
    assert 4096 <= step <= 2 << 20 and step % 4096 == 0


def test_stream_pipeline_through_several_small_staging_buffers_converts_bit_exactly_and_closes_files(component_writer):
    g = torch.Generator().manual_seed(11)
    shards = [
        {f"blocks.{i}.to_{n}.weight": (torch.randn(1536, 1024, generator=g) + 2).to(torch.bfloat16) for n in "qk"}
        for i in range(2)
    ] + [{"blocks.0.to_v.weight": (torch.randn(1536, 1024, generator=g) + 2).to(torch.bfloat16), "bias": torch.randn(7, generator=g)}]
    path = component_writer(shards)
    placement = get_placement("stream", threads=3, staging_bytes=1 << 20, staging_buffers=3, readahead_bytes=1 << 20)
    merges = {r"\1.qkv.weight": [r"(blocks\.0)\.to_q\.weight", r"(blocks\.0)\.to_k\.weight", r"(blocks\.0)\.to_v\.weight"]}
    module, report = load_checkpoint(path, LoadOptions(mode=placement, dtype="fp32", merges=merges))
    source = {k: v for s in shards for k, v in s.items()}
    state = module.state_dict()
    fused = torch.cat([source[f"blocks.0.to_{n}.weight"] for n in "qkv"]).float()
    assert torch.equal(state["blocks.0.qkv.weight"], fused)
    for name in ("blocks.1.to_q.weight", "blocks.1.to_k.weight", "bias"):
        assert torch.equal(state[name], source[name].float())
    assert report.tensors_placed == 4
    open_files = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")]
    assert not [f for f in open_files if f.startswith(str(path))]


def test_stream_takes_readahead_off_with_zero_and_rejects_a_negative_window():
    assert get_placement("stream", readahead_bytes=0).tuning.readahead_bytes == 0
    with pytest.raises(PlacementError, match="readahead_bytes must be an integer >= 0, got -1"):
        get_placement("stream", readahead_bytes=-1)
