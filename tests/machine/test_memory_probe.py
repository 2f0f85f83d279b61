"""The memory probe's /proc parsing: one search per field must read what splitting every line reads."""

from __future__ import annotations

from pathlib import Path

from machine.memory import _kib_field


def _by_lines(text: bytes, key: bytes) -> int:
    for line in text.splitlines():
        if line.split(b":", 1)[0] == key:
            return int(line.split()[1]) * 1024
    return 0


def test_kib_fields_of_the_live_proc_files_match_a_line_by_line_parse():
    status, meminfo = Path("/proc/self/status").read_bytes(), Path("/proc/meminfo").read_bytes()
    for key in (b"VmRSS", b"RssAnon", b"RssFile", b"VmHWM"):
        assert _kib_field(status, key) == _by_lines(status, key) > 0, key
    assert _kib_field(meminfo, b"MemAvailable") == _by_lines(meminfo, b"MemAvailable") > 0


def test_a_missing_field_reads_zero_and_a_last_line_without_newline_still_parses():
    text = b"Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB"
    assert _kib_field(text, b"VmRSS") == 1024 * 1024
    assert _kib_field(text, b"VmHWM") == 2048 * 1024
    assert _kib_field(text, b"RssAnon") == 0
    assert _kib_field(text, b"Vm") == 0  # a prefix of a key is not the key
