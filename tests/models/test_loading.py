"""`load_component`: the explicit `cpu_offload=` entry point applies the unified-memory guard."""

from __future__ import annotations

import logging

import torch

from loader.device import DeviceInfo
from models.loading import load_component

# The target is the CPU here (no GPU), so "device" and "host" are the same place; what the
# guard decided shows in the report's device and in the log, which is what these tests read.
GB10 = DeviceInfo("cuda", "cuda", 0, "NVIDIA GB10", True, 121 * 2**30, "fake-driver", "integrated GPU (fake probe)")
H200 = DeviceInfo("cuda", "cuda", 0, "NVIDIA H200", False, 141 * 2**30, "fake-driver", "discrete GPU (fake probe)")


def test_unified_memory_overrides_an_explicit_cpu_offload_and_says_why(tiny_model, caplog):
    with caplog.at_level(logging.WARNING, logger="loader.offload"):
        module, report = load_component(tiny_model, "vae", device=torch.device("cpu"), device_info=GB10, cpu_offload=True)
    assert report.tensors_placed == report.tensors_total > 0
    assert not module.training
    [record] = [r for r in caplog.records if "load_component('vae')" in r.getMessage()]
    assert "cpu_offload=True overridden to False" in record.getMessage()
    assert "NVIDIA GB10" in record.getMessage()


def test_discrete_device_keeps_an_explicit_cpu_offload_without_a_warning(tiny_model, caplog):
    with caplog.at_level(logging.WARNING, logger="loader.offload"):
        _, report = load_component(tiny_model, "vae", device=torch.device("cpu"), device_info=H200, cpu_offload=True)
    assert report.device == "cpu"
    assert not [r for r in caplog.records if "overridden" in r.getMessage()]
