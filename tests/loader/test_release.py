"""Sources are released: drain empties its dict and frees every view; stream leaves no file mapped or open."""

from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from core import PlacementError
from loader import LoadOptions, load_checkpoint
from loader.placement.dict_modes import DrainPlacement, RetainPlacement


class _Watched:
    """Wraps `collect` to keep the dict and weak references to every source view."""

    def collect(self, plan):
        state = super().collect(plan)
        self.state = state
        self.refs = {name: weakref.ref(t) for name, t in state.items()}
        return state


class WatchedDrain(_Watched, DrainPlacement):
    pass


class WatchedRetain(_Watched, RetainPlacement):
    pass


@pytest.fixture
def checkpoint_with_extra_state(tiny_checkpoint, component_writer) -> Path:
    """The tiny shards plus a `*_extra_state` entry in the second shard."""
    shards = [dict(s) for s in tiny_checkpoint.shards]
    shards[1]["blocks.1.ff._extra_state"] = torch.arange(1, 9, dtype=torch.uint8)
    return component_writer(shards)


def _module_without_proj_in(tiny_checkpoint) -> nn.Module:
    """A skeleton-like module holding every tiny tensor except proj_in (so proj_in.* is unexpected)."""
    root = nn.Module()
    for name, t in tiny_checkpoint.tensors.items():
        if name.startswith("proj_in"):
            continue
        *path, leaf = name.split(".")
        owner = root
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, nn.Module())
            owner = getattr(owner, part)
        owner.register_parameter(leaf, nn.Parameter(torch.empty(t.shape, dtype=t.dtype, device="meta"), requires_grad=False))
    return root


def _mapped_or_open(folder: Path) -> list[str]:
    folder = str(folder.resolve())
    mapped = [line for line in Path("/proc/self/maps").read_text().splitlines() if folder in line]
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(folder):
            fds.append(target)
    return mapped + fds


@pytest.mark.parametrize("placement_class", [WatchedDrain, WatchedRetain])
def test_dict_modes_end_with_an_empty_dict_and_every_view_freed_across_both_skip_paths(
    tiny_checkpoint, checkpoint_with_extra_state, placement_class
):
    placement = placement_class()
    module, report = load_checkpoint(
        checkpoint_with_extra_state,
        LoadOptions(mode=placement, strict=False),
        module=_module_without_proj_in(tiny_checkpoint),
    )
    assert report.skipped == ["blocks.1.ff._extra_state"]
    assert report.unexpected == ["proj_in.bias", "proj_in.weight"]
    assert placement.state == {}
    gc.collect()
    alive = [name for name, ref in placement.refs.items() if ref() is not None]
    assert alive == []
    assert set(placement.refs) == set(tiny_checkpoint.tensors) | {"blocks.1.ff._extra_state"}
    assert _mapped_or_open(checkpoint_with_extra_state) == []


def test_drain_pops_each_source_before_the_next_tensor_is_placed(tiny_checkpoint):
    placement = WatchedDrain()
    sizes = []
    load_checkpoint(
        tiny_checkpoint.path,
        LoadOptions(mode=placement),
        on_tensor=lambda e: sizes.append(len(placement.state)),
    )
    assert sizes == list(range(len(tiny_checkpoint.tensors) - 1, -1, -1))


def test_retain_keeps_every_source_until_the_last_tensor_is_placed(tiny_checkpoint):
    placement = WatchedRetain()
    sizes = []
    load_checkpoint(
        tiny_checkpoint.path,
        LoadOptions(mode=placement),
        on_tensor=lambda e: sizes.append(len(placement.state)),
    )
    assert sizes == [len(tiny_checkpoint.tensors)] * len(tiny_checkpoint.tensors)
    assert placement.state == {}


def test_a_failed_placement_still_releases_the_drain_dict(tiny_checkpoint):
    placement = WatchedDrain()

    def fail(event):
        if event.index == 2:
            raise RuntimeError("listener failed")

    with pytest.raises(RuntimeError, match="listener failed"):
        load_checkpoint(tiny_checkpoint.path, LoadOptions(mode=placement), on_tensor=fail)
    assert placement.state == {}
    gc.collect()
    assert [n for n, r in placement.refs.items() if r() is not None] == []


@pytest.mark.parametrize("dtype", [None, "fp16"])
def test_stream_leaves_no_checkpoint_file_mapped_or_open(checkpoint_with_extra_state, dtype):
    load_checkpoint(checkpoint_with_extra_state, LoadOptions(mode="stream", dtype=dtype))
    assert _mapped_or_open(checkpoint_with_extra_state) == []


def test_stream_closes_each_shard_once_its_last_tensor_is_placed(tiny_checkpoint):
    open_after = []
    load_checkpoint(
        tiny_checkpoint.path,
        LoadOptions(mode="stream"),
        on_tensor=lambda e: open_after.append((e.name, {Path(p).name for p in _mapped_or_open(tiny_checkpoint.path)})),
    )
    for number, shard in enumerate(tiny_checkpoint.shards, 1):
        file = f"model-{number:05d}-of-00003.safetensors"
        last = max(i for i, (name, _) in enumerate(open_after) if name in shard)
        assert all(file not in still_open for _, still_open in open_after[last:]), file
    assert open_after[-1][1] == set()


def test_a_strict_failure_reads_nothing_and_leaves_nothing_open(tiny_checkpoint):
    with pytest.raises(PlacementError):
        load_checkpoint(tiny_checkpoint.path, module=_module_without_proj_in(tiny_checkpoint))
    assert _mapped_or_open(tiny_checkpoint.path) == []


def test_closing_a_memory_probe_twice_leaves_other_descriptors_open(tmp_path):
    from machine.memory import MemoryProbe

    probe = MemoryProbe()
    probe.close()
    other = os.open(tmp_path / "reuses-a-freed-number", os.O_CREAT | os.O_RDWR)
    try:
        probe.close()
        os.fstat(other)  # raises if the second close took it
    finally:
        os.close(other)
