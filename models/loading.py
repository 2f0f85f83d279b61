"""`load_component`: load one component of a model folder where its offload flag says.

This is the entry point for callers that decide offload per call with an
explicit `cpu_offload=` argument instead of resolved settings. Such a call
bypasses `resolve_offload`, so it goes through `guard_cpu_offload`: on unified
memory a request to load to the host is overridden (and logged), because the
host copy would free nothing and cost a second copy.
"""

from __future__ import annotations

import os
from typing import Callable

import torch
import torch.nn as nn

from loader import load_checkpoint
from loader.device import DeviceInfo
from loader.memory import MemoryProbe
from loader.offload import guard_cpu_offload
from loader.report import LoadReport, TensorPlaced


def load_component(
    model_dir: str | os.PathLike,
    component: str,
    *,
    device: torch.device,
    device_info: DeviceInfo,
    cpu_offload: bool = False,
    dtype: torch.dtype | None = None,
    mode: str = "stream",
    on_tensor: Callable[[TensorPlaced], None] | None = None,
    probe: MemoryProbe | None = None,
) -> tuple[nn.Module, LoadReport]:
    """Load `component` of `model_dir` in eval mode, on the host when `cpu_offload` holds on this device.

    Returns the module and the loader's report; the module sits on `device`
    or, when offloaded, on the CPU.
    """
    offload = guard_cpu_offload(cpu_offload, device_info, site=f"load_component({component!r})")
    target = torch.device("cpu") if offload else device
    module, report = load_checkpoint(
        model_dir, component=component, mode=mode, device=target, dtype=dtype, on_tensor=on_tensor, probe=probe
    )
    module.eval().requires_grad_(False)
    return module, report
