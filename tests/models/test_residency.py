"""Which components the loader places page-locked (`pins_host_copy`): only what group offload copies to CUDA
from pinned memory, and never a DiT being quantized."""

from __future__ import annotations

import pytest

from machine.offload import OffloadSettings
from models.run.residency import GROUP_OFFLOAD, MODEL_OFFLOAD, ON_DEVICE, Placement, pins_host_copy


def _placement(mechanism: str) -> Placement:
    return Placement("transformer", mechanism, None, "cpu" if mechanism != ON_DEVICE else "cuda")


@pytest.mark.parametrize(("mechanism", "device", "pin", "quantized", "expected"), [
    (GROUP_OFFLOAD, "cuda", True, False, True),
    (GROUP_OFFLOAD, "cuda", False, False, False),  # group offload then pins each block as it goes
    (GROUP_OFFLOAD, "cuda", True, True, False),  # quantizing replaces the tensors as they are placed
    (GROUP_OFFLOAD, "cpu", True, False, False),  # nothing copies to a GPU
    (MODEL_OFFLOAD, "cuda", True, False, False),  # accelerate moves the whole module, from pageable memory
    (ON_DEVICE, "cuda", True, False, False),
])
def test_only_a_group_offloaded_unquantized_component_on_cuda_with_pinning_on_is_placed_pinned(
        mechanism, device, pin, quantized, expected):
    settings = OffloadSettings(pin_cpu_memory=pin)
    assert pins_host_copy(_placement(mechanism), device, settings, quantized=quantized) is expected

