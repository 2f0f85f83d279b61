"""`LoadOptions`: one dataclass for a load's options, carrying the device probe a job already made."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from core.errors import PlacementError
from loader import LoadOptions, load_checkpoint
from loader.placement import get_placement
from loader.placement.dict_modes import DrainPlacement
from loader.placement.tuning import TUNING_OPTIONS, StreamTuning
from machine.device import DeviceInfo, probe_device


class _SeesTheProbe(DrainPlacement):
    """`drain`, remembering the device facts its context carried."""

    def place(self, plan, ctx) -> None:
        self.seen = ctx.device_info
        super().place(plan, ctx)


def test_the_placement_gets_the_probe_the_caller_made_instead_of_probing_again(tiny_checkpoint):
    info = probe_device("cpu")
    placement = _SeesTheProbe()
    module, report = load_checkpoint(tiny_checkpoint.path, LoadOptions(mode=placement, device_info=info))
    assert placement.seen is info and report.tensors_placed == len(tiny_checkpoint.tensors)
    placement = _SeesTheProbe()
    load_checkpoint(tiny_checkpoint.path, LoadOptions(mode=placement))
    assert placement.seen is None  # nothing probed on its behalf: a placement that needs it probes


def test_a_probe_of_another_device_than_the_loads_is_refused_before_a_byte_is_read(tiny_checkpoint):
    gpu = DeviceInfo(spec="cuda:1", kind="cuda", index=1, name="a GPU", unified_memory=False, total_memory=1 << 30,
                     source="test", reason="a probe of another device")
    with pytest.raises(PlacementError, match="device_info describes 'cuda:1', but the load targets 'cpu'"):
        load_checkpoint(tiny_checkpoint.path, LoadOptions(device_info=gpu))


def test_every_load_option_is_one_field_and_the_call_keeps_only_the_module_and_its_callbacks():
    import inspect

    assert list(inspect.signature(load_checkpoint).parameters) == ["path", "options", "module", "on_tensor", "probe"]
    options = LoadOptions(mode="drain", dtype="bf16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.dtype = torch.float16


def test_reserve_is_one_of_streams_product_options_not_a_benchmark_tuning():
    assert "reserve" not in TUNING_OPTIONS and "reserve" not in {f.name for f in dataclasses.fields(StreamTuning)}
    assert get_placement("stream").reserve is True and get_placement("stream", reserve=False).reserve is False
    with pytest.raises(PlacementError, match="reserve must be true or false"):
        get_placement("stream", reserve="no")
