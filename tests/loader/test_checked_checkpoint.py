"""Discovery remembered by the files' identity (path, size, mtime_ns, inode): asking again about files that
did not change parses no header; any change to them is discovered anew. Counted, not timed."""

from __future__ import annotations

import json
import os
import time

import pytest

from loader import checkpoint
from loader.checkpoint import checked_checkpoint, checkpoint_identity, checkpoint_problems
from tests.conftest import tiny_shards


@pytest.fixture
def discoveries(monkeypatch) -> list:
    """Every call of the loader's discovery, by path."""
    calls = []
    real = checkpoint.discover_checkpoint

    def counted(path, **kwargs):
        calls.append(str(path))
        return real(path, **kwargs)

    monkeypatch.setattr(checkpoint, "discover_checkpoint", counted)
    return calls


@pytest.fixture
def fresh(component_writer):
    """A three-shard component folder of this test's own (the session's tiny checkpoint must stay as it is),
    its files a minute old: a tree changed in the last seconds is never remembered."""
    folder = component_writer(tiny_shards(), name="fresh")
    for entry in [folder, *folder.iterdir()]:
        age(entry, 60)
    return folder


def age(path, seconds: float) -> None:
    os.utime(path, ns=(time.time_ns(), time.time_ns() - int(seconds * 1e9)))


def test_asking_again_about_unchanged_files_discovers_nothing(fresh, discoveries):
    roots = [fresh.parent]
    first = checked_checkpoint(fresh, roots)
    again = checkpoint_problems(fresh, roots)
    assert len(discoveries) == 1
    assert again[0] is first[0] and again[1] == [] and first[1] == ()
    assert sum(c.tensor_count for c in first[0].components.values()) == sum(len(s) for s in tiny_shards())


def test_a_changed_file_is_discovered_anew(fresh, discoveries):
    roots = [fresh.parent]
    checked_checkpoint(fresh, roots)
    shard = sorted(fresh.glob("*.safetensors"))[-1]
    with open(shard, "r+b") as f:  # the same size, one byte of the data changed: only mtime_ns tells
        f.seek(-1, os.SEEK_END)
        f.write(b"\x01")
    checked_checkpoint(fresh, roots)
    checked_checkpoint(fresh, roots)  # changed a moment ago: not remembered yet, asked again
    assert len(discoveries) == 3
    age(shard, 30)
    checked_checkpoint(fresh, roots)
    checked_checkpoint(fresh, roots)
    assert len(discoveries) == 4
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 4)
    index, problems = checked_checkpoint(fresh, roots)
    assert len(discoveries) == 5 and problems  # the truncated shard is seen at once


def test_shards_outside_the_folder_are_never_remembered(component_writer, tmp_path, discoveries):
    outside = component_writer([{"w": __import__("torch").ones(2)}], name="elsewhere")
    folder = tmp_path / "c"
    folder.mkdir()
    weights = next(outside.glob("*.safetensors")).name
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": f"../elsewhere/{weights}"}}))
    for _ in range(2):
        checked_checkpoint(folder, [tmp_path])
    assert len(discoveries) == 2  # its identity would not cover the shard it names


def test_a_forecast_asked_again_is_remembered_except_a_cuda_streams_ring(fresh, monkeypatch):
    """The forecast's arithmetic runs over every tensor; a CUDA stream's ring follows MemAvailable and the page
    cache now, so that one is made anew each time."""
    from loader import forecast
    from machine.device import DeviceInfo

    made = []
    real = forecast._forecast
    monkeypatch.setattr(forecast, "_forecast", lambda *args: made.append(args) or real(*args))
    roots = [fresh.parent]
    first = forecast.forecast_load(fresh, roots=roots)
    assert forecast.forecast_load(fresh, roots=roots) == first and len(made) == 1
    assert forecast.forecast_load(fresh, roots=roots, mode="drain") != first and len(made) == 2
    gpu = DeviceInfo("cuda:0", "cuda", 0, "a fake GPU", False, 16 * 2**30, "fake", "a faithful fake")
    for _ in range(2):
        forecast.forecast_load(fresh, roots=roots, device="cuda:0", device_info=gpu)
    assert len(made) == 4


def test_a_tree_changed_a_moment_ago_has_no_identity_yet(fresh):
    assert checkpoint_identity(fresh) is not None
    age(next(fresh.glob("*.safetensors")), 0)
    assert checkpoint_identity(fresh) is None
