"""The memory the kernel reports: /proc/meminfo and PSI, read from fake files."""

from __future__ import annotations

import pytest

from dashboard.host import cuda_free_note, parse_meminfo, read_host_memory, read_pressure

KIB = 1024
GIB = 2**30

MEMINFO = """MemTotal:       25165824 kB
MemFree:         4194304 kB
MemAvailable:   16777216 kB
Buffers:          262144 kB
Cached:         11534336 kB
SwapTotal:       2097152 kB
SwapFree:        1048576 kB
"""


def test_meminfo_keeps_free_available_cache_and_in_use_apart(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO)
    host = read_host_memory(path)
    assert (host.total, host.free, host.available, host.cached) == (24 * GIB, 4 * GIB, 16 * GIB, 11 * GIB)
    assert host.in_use == 8 * GIB  # MemTotal − MemAvailable, not MemTotal − MemFree (20 GiB)
    assert host.reclaimable == 12 * GIB
    assert host.swap_used == 1 * GIB


def test_meminfo_without_memfree_names_the_field():
    with pytest.raises(ValueError, match="lacks MemFree"):
        parse_meminfo(MEMINFO.replace("MemFree:         4194304 kB\n", ""))


def test_the_unified_memory_note_says_cuda_free_follows_memfree():
    note = cuda_free_note(parse_meminfo(MEMINFO))
    assert "follows MemFree (4.0 GiB)" in note and "MemAvailable (16.0 GiB)" in note


def test_pressure_is_read_from_the_psi_file(tmp_path):
    path = tmp_path / "memory"
    path.write_text("some avg10=1.25 avg60=0.50 avg300=0.10 total=12345\nfull avg10=0.75 avg60=0.20 avg300=0.05 total=678\n")
    pressure = read_pressure(path)
    assert (pressure.some_avg10, pressure.full_avg10, pressure.some_avg60, pressure.full_avg60) == (1.25, 0.75, 0.5, 0.2)


def test_no_psi_file_means_no_pressure_reading(tmp_path):
    assert read_pressure(tmp_path / "missing") is None


def test_a_malformed_psi_file_is_named(tmp_path):
    path = tmp_path / "memory"
    path.write_text("some avg10=x\n")
    with pytest.raises(ValueError, match=f"{path}: expected 'some' and 'full' lines"):
        read_pressure(path)
