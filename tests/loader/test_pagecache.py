"""loader.io.pagecache: mincore-based residency, exact and sampled, against files this test caches and drops."""

from __future__ import annotations

import os

import pytest

from loader.io.pagecache import drop, resident_fraction, sampled_resident_fraction

_MiB = 1 << 20


@pytest.fixture
def big_file(tmp_path):
    path = tmp_path / "shard.bin"
    path.write_bytes(os.urandom(64 * _MiB))
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    yield fd
    os.close(fd)


def test_the_sampled_fraction_tells_a_cached_file_a_cold_one_and_a_half_cached_one_apart(big_file):
    fd = big_file
    os.pread(fd, 64 * _MiB, 0)
    assert resident_fraction(fd) == 1.0 and sampled_resident_fraction(fd) == 1.0
    drop(fd)
    if resident_fraction(fd) > 0.5:
        pytest.skip("this file system keeps pages resident after POSIX_FADV_DONTNEED (tmpfs?)")
    assert sampled_resident_fraction(fd) < 0.05
    os.pread(fd, 32 * _MiB, 0)  # the first half only
    exact = resident_fraction(fd)
    assert 0.45 < exact < 0.75  # readahead may run a little past the half
    assert abs(sampled_resident_fraction(fd) - exact) < 0.1


def test_a_small_or_empty_file_is_measured_exactly(tmp_path):
    path = tmp_path / "small.bin"
    path.write_bytes(b"x" * 10_000)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert sampled_resident_fraction(fd) == resident_fraction(fd) == 1.0
    finally:
        os.close(fd)
    empty = tmp_path / "empty.bin"
    empty.touch()
    fd = os.open(empty, os.O_RDONLY)
    try:
        assert sampled_resident_fraction(fd) == 1.0
    finally:
        os.close(fd)
