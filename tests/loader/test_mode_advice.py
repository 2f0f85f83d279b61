"""The warning against mmap-based modes on unified memory, and where the CLIs print it."""

from __future__ import annotations

import pytest

from loader.placement import advice
from loader.placement.advice import mode_warning
from machine.device import DeviceInfo


def _info(kind: str, unified: bool) -> DeviceInfo:
    return DeviceInfo(f"{kind}:0" if kind == "cuda" else kind, kind, 0 if kind == "cuda" else None, "NVIDIA GB10",
                      unified, 128 << 30, "test", "a fake device")


@pytest.mark.parametrize("mode", ["drain", "retain"])
def test_mmap_modes_on_unified_cuda_get_one_line_naming_the_mode_and_stream(mode):
    warning = mode_warning(mode, _info("cuda", True))
    assert warning is not None and "\n" not in warning
    assert f"mode {mode} reads through mmap views" in warning and "stream, the default" in warning
    assert "NVIDIA GB10" in warning


@pytest.mark.parametrize("mode, info", [
    ("stream", _info("cuda", True)),
    ("drain", _info("cuda", False)),
    ("retain", _info("cpu", True)),  # the CPU counts as unified, but there mmap is what drain is for
    ("drain", None),
])
def test_no_warning_for_stream_discrete_gpus_the_cpu_or_an_unknown_device(mode, info):
    assert mode_warning(mode, info) is None


def test_the_load_and_submit_command_lines_print_it_on_stderr(monkeypatch, capsys):
    monkeypatch.setattr(advice, "probe_device", lambda spec: _info("cuda", True))
    advice.warn_about_mode("drain", "cuda")
    advice.warn_about_mode("stream", "cuda")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: mode drain")
    import loader.cli

    assert loader.cli.warn_about_mode is advice.warn_about_mode


def test_a_bad_device_spec_is_left_to_the_load_to_report(capsys):
    advice.warn_about_mode("drain", "tpu:3")
    assert capsys.readouterr().err == ""
