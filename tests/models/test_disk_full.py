"""Writers on a full disk: synth refuses up front or cleans up when the disk fills mid-write; the MP4 writer names its file."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from core.errors import DiskFullError
from models.cli import main
from models.video.encode import write_mp4
from models.synth.writer import synth_h3
from models.synth.profiles import get_profile

def fill(folder: Path) -> None:
    """Take every free byte of `folder`'s filesystem, the way another writer would."""
    with open(folder / "filler", "wb") as f:
        f.write(b"\0" * shutil.disk_usage(folder).free)


def filler_after(disk: Path, fraction: float):
    """An `on_bytes` callback that fills `disk` once `fraction` of the checkpoint is written."""

    def on_bytes(done: int, total: int) -> None:
        if done > total * fraction and not (disk / "filler").exists():
            fill(disk)

    return on_bytes


def test_synth_command_refuses_before_writing_when_the_disk_is_too_small_naming_folder_need_and_free(
        small_tmpfs, capsys):
    disk = small_tmpfs(1024 * 1024)
    out = disk / "tiny"
    code = main(["synth", str(out), "--profile", "tiny", "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 2 and body["ok"] is False
    [line] = body["errors"]
    assert line.startswith(f"not enough disk space in {out}: the tiny checkpoint needs ")
    assert int(line.split(" needs ")[1].split(" bytes")[0].replace(",", "")) > h3_tiny_bytes()
    assert line.endswith(f", {1024 * 1024:,} bytes free")
    assert not out.exists()


def test_an_mp4_written_to_a_full_device_raises_disk_full_naming_it_and_leaves_the_device_alone():
    with pytest.raises(DiskFullError, match=r"^disk full while writing /dev/full: [\d,]+ bytes free$"):
        write_mp4("/dev/full", np.zeros((5, 16, 16, 3), np.uint8), 8, np.zeros(2400, np.float32))
    assert Path("/dev/full").exists()


def test_an_mp4_that_fills_the_disk_is_removed(small_tmpfs):
    disk = small_tmpfs(16 * 1024)
    noise = np.random.default_rng(0).integers(0, 256, (9, 64, 64, 3), dtype=np.uint8)
    with pytest.raises(DiskFullError, match=rf"^disk full while writing {disk / 'clip.mp4'}: .*; removed the partial file$"):
        write_mp4(disk / "clip.mp4", noise, 8)
    assert list(disk.iterdir()) == []


def h3_tiny_bytes() -> int:
    return sum(c.bytes for c in synth_h3("unused", get_profile("tiny"), dry_run=True).components)


def test_h3_synth_refuses_before_writing_when_the_disk_is_too_small(small_tmpfs):
    disk = small_tmpfs(1024 * 1024)
    out = disk / "tiny"
    with pytest.raises(DiskFullError) as caught:
        synth_h3(out, get_profile("tiny"))
    line = str(caught.value)
    assert line.startswith(f"not enough disk space in {out}: the tiny checkpoint needs ")
    assert int(line.split(" needs ")[1].split(" bytes")[0].replace(",", "")) > h3_tiny_bytes()
    assert not out.exists()


def test_h3_synth_hit_by_a_full_disk_mid_write_removes_its_files_and_names_the_shard(small_tmpfs):
    disk = small_tmpfs(2 * h3_tiny_bytes() + 8 * 2**20)
    out = disk / "tiny"
    with pytest.raises(DiskFullError) as caught:
        synth_h3(out, get_profile("tiny"), on_bytes=filler_after(disk, 1 / 3))
    message = str(caught.value)
    # The file named is the one being written when the disk filled: a shard, or the index written after
    # its shards (progress, which fills this disk, is reported from the caller's thread between writes).
    assert message.startswith(f"disk full while writing {out}/") and re.search(r"\.safetensors(\.index\.json)?: ", message)
    assert "removed the " in message and "\n" not in message
    assert list(out.rglob("*.safetensors")) == [] and list(out.rglob("*.json")) == []


def test_an_h3_rewrite_that_fails_on_a_full_disk_does_not_leave_the_old_root_looking_complete(small_tmpfs):
    disk = small_tmpfs(int(1.5 * h3_tiny_bytes()) + 8 * 2**20)
    out = disk / "tiny"
    synth_h3(out, get_profile("tiny"))
    assert (out / "modular_model_index.json").is_file()
    synth_h3(out, get_profile("tiny"), seed=1)  # replaced shards count as free
    assert json.loads((out / "modular_model_index.json").read_text())["_drainboard_seed"] == 1
    with pytest.raises(DiskFullError, match=r"^disk full while writing .*tiny/text_encoder/model[-.]"):
        synth_h3(out, get_profile("tiny"), on_bytes=filler_after(disk, 0.1))
    assert not (out / "modular_model_index.json").exists()
    assert not (out / "text_encoder" / "model.safetensors.index.json").exists()
