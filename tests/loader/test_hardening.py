"""Crafted checkpoints and files changed under a load (issue 26, items 1, 2, 6, 10).

- a shard swapped for a link after discovery, or mid-load, is refused (or only the validated file is read);
- a FIFO named like any file a checkpoint names never hangs inspect or a load;
- messages stay bounded, the index check is linear, one header budget covers a whole checkpoint;
- shapes overflowing int64, huge integers, overlong or NUL names: one line, rc 2;
- a shard truncated while mapped (drain) is one line, not a SIGBUS.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from loader import safetensors_file
from loader.api import load_checkpoint
from loader.options import LoadOptions
from loader.checkpoint import discover_checkpoint
from loader.cli import main
from core.errors import CheckpointError
from loader.placement.dict_modes import DrainPlacement
from loader.placement.stream import StreamPlacement

REPO_ROOT = Path(__file__).resolve().parents[2]


def _write(folder: Path, shards: list[dict[str, torch.Tensor]]) -> Path:
    folder.mkdir(parents=True)
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, folder / file)
        weight_map.update(dict.fromkeys(shard, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


def _two_shards(value: float = 1.0) -> list[dict[str, torch.Tensor]]:
    return [{"a.weight": torch.full((64,), value), "b.weight": torch.full((64,), value)},
            {"c.weight": torch.full((64,), value)}]


def _raw_shard(path: Path, header: dict | bytes, data: bytes = b"") -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    return path


def _cli(capsys, *argv: str) -> tuple[int, dict]:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def _swap_for_link(shard: Path, outside: Path) -> None:
    """`ln -sf OUTSIDE tmp && mv -Tf tmp shard`: the swap issue 26 made."""
    tmp = shard.with_name("swap.tmp")
    tmp.symlink_to(outside)
    os.replace(tmp, shard)


class _SwapOnPrepare:
    """A placement mixin that swaps the second shard for a link to an outside file after discovery."""

    swap: tuple[Path, Path]

    def prepare(self, plan, ctx):
        super().prepare(plan, ctx)
        _swap_for_link(*self.swap)


class _StreamSwap(_SwapOnPrepare, StreamPlacement):
    pass


class _DrainSwap(_SwapOnPrepare, DrainPlacement):
    pass


@pytest.fixture
def swapped(tmp_path):
    """(checkpoint folder, its second shard, an outside safetensors of the same layout holding 7s)."""
    root = tmp_path / "models"
    folder = _write(root / "c", _two_shards(1.0))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    save_file(_two_shards(7.0)[1], outside / "evil.safetensors")
    return root, folder, sorted(folder.glob("*.safetensors"))[1], outside / "evil.safetensors"


def _refused_or_validated(run) -> None:
    """The load is refused naming the swap, or every byte it placed is the validated file's (ones)."""
    try:
        module, _ = run()
    except CheckpointError as exc:
        assert "refused" in str(exc) and "model-00002-of-00002.safetensors" in str(exc)
        return
    assert all(torch.equal(t, torch.ones(64)) for t in module.state_dict().values()), "read the outside file"


@pytest.mark.parametrize("placement", [_StreamSwap, _DrainSwap])
def test_a_shard_swapped_for_an_outside_link_after_discovery_is_never_read(swapped, placement):
    root, folder, shard, outside = swapped
    mode = placement()
    mode.swap = (shard, outside)
    _refused_or_validated(lambda: load_checkpoint(folder, LoadOptions(mode=mode, roots=[root])))


def test_a_shard_swapped_mid_load_in_stream_reads_only_the_validated_file(swapped):
    root, folder, shard, outside = swapped
    swapped_once = []

    def on_tensor(placed):
        if not swapped_once:
            swapped_once.append(placed.name)
            _swap_for_link(shard, outside)

    _refused_or_validated(lambda: load_checkpoint(folder, LoadOptions(mode="stream", roots=[root]), on_tensor=on_tensor))
    assert swapped_once


def _returns_promptly(call, seconds: float = 10.0):
    """`call()`'s result, failing (instead of hanging the suite) when it has not returned in time."""
    box: list = []
    worker = threading.Thread(target=lambda: box.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still blocked after {seconds} s (opened a FIFO?)"
    return box[0]


@pytest.mark.parametrize("fifo_name", ["model-00002-of-00002.safetensors", "model.safetensors.index.json", "config.json"])
def test_a_fifo_named_like_a_checkpoint_file_is_refused_and_never_hangs(tmp_path, capsys, fifo_name):
    folder = _write(tmp_path / "c", _two_shards())
    (folder / fifo_name).unlink(missing_ok=True)
    os.mkfifo(folder / fifo_name)
    code, out = _returns_promptly(lambda: _cli(capsys, "inspect", str(folder)))
    assert code == 2 and "is a FIFO, not a regular file; refused" in out["error"] and fifo_name in out["error"]
    code, out = _returns_promptly(lambda: _cli(capsys, "load", str(folder), "--mode", "drain"))
    assert code == 2 and "is a FIFO" in out["error"]


def test_many_bad_tensors_give_a_bounded_message(tmp_path, capsys):
    header = {f"t{i}": {"dtype": "NOPE", "shape": [1], "data_offsets": [0, 1]} for i in range(100_000)}
    header["x" * 1_000_000] = {"dtype": "NOPE", "shape": [1], "data_offsets": [0, 1]}
    _raw_shard(tmp_path / "bad.safetensors", header, b"\0")
    code, out = _cli(capsys, "inspect", str(tmp_path / "bad.safetensors"))
    assert code == 2 and len(out["error"]) < 10_000
    assert re.fullmatch(r"and \d{6} more", out["errors"][-1]) and len(out["errors"]) == 11


def test_the_index_check_is_linear_in_its_entries(tmp_path):
    def check(entries: int) -> tuple[float, CheckpointError]:
        folder = tmp_path / f"c{entries}"
        folder.mkdir(exist_ok=True)
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {f"t{i}": f"missing-{i}.safetensors" for i in range(entries)}}))
        best, caught = float("inf"), None
        for _ in range(3):  # the fastest of three: a busy box only ever adds time
            start = time.perf_counter()
            with pytest.raises(CheckpointError) as caught:
                discover_checkpoint(folder)
            best = min(best, time.perf_counter() - start)
        return best, caught.value

    small, _ = check(1_000)
    large, error = check(10_000)
    # Ten times the entries: about 10x the time if linear, 100x if quadratic (the quadratic check took 18 s
    # for 20,000 on a fast host). Measured side by side, so a loaded box slows both alike.
    assert large / max(small, 1e-3) < 35
    assert error.total == 10_000 and error.problems[-1] == "and 9990 more"


def test_one_header_budget_covers_a_whole_checkpoint(tmp_path, monkeypatch):
    folder = _write(tmp_path / "c", _two_shards())
    sizes = [int.from_bytes(p.read_bytes()[:8], "little") for p in sorted(folder.glob("*.safetensors"))]
    monkeypatch.setattr(safetensors_file, "MAX_CHECKPOINT_HEADER_BYTES", sizes[0] + sizes[1] - 1)
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors: its header would pass the"):
        discover_checkpoint(folder)


@pytest.mark.parametrize("shape", [[0, 2**70], [0, 2**63 - 1, 2**63 - 1], [2**40, 2**40]])
def test_shapes_whose_size_or_stride_overflows_int64_are_refused(tmp_path, capsys, shape):
    _raw_shard(tmp_path / "s.safetensors", {"t": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}})
    code, out = _cli(capsys, "load", str(tmp_path / "s.safetensors"))
    assert code == 2 and ("torch sizes are int64" in out["error"] or "torch strides are int64" in out["error"])


def test_a_number_of_5000_digits_in_a_header_is_one_line(tmp_path, capsys):
    raw = b'{"t": {"dtype": "F32", "shape": [' + b"1" * 5000 + b'], "data_offsets": [0, 4]}}'
    _raw_shard(tmp_path / "n.safetensors", raw, bytes(4))
    code, out = _cli(capsys, "inspect", str(tmp_path / "n.safetensors"))
    assert code == 2 and "more than 4300 digits" in out["error"] and len(out["errors"]) == 1


@pytest.mark.parametrize("file", ["x" * 5000 + ".safetensors", "a\0b.safetensors"])
def test_an_index_naming_an_impossible_file_is_one_line(tmp_path, capsys, file):
    folder = _write(tmp_path / "c", _two_shards())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a.weight": file}}))
    code, out = _cli(capsys, "inspect", str(folder))
    assert code == 2 and ("NUL" in out["error"] or "longer than the 255" in out["error"])
    assert len(out["error"]) < 2000


def test_an_unlistable_component_folder_is_one_line(tmp_path, capsys, monkeypatch):
    """chmod 000 on the folder; as root (which ignores modes) the refusal is faked at the access check."""
    folder = _write(tmp_path / "c", _two_shards())
    folder.chmod(0)
    if os.geteuid() == 0:
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, m, **kw: Path(p) != folder and real_access(p, m, **kw))
    try:
        code, out = _cli(capsys, "inspect", str(folder))
    finally:
        folder.chmod(0o755)
    assert code == 2 and "cannot list the folder" in out["error"] and "Permission denied" in out["error"]


TRUNCATE_MID_DRAIN = """
import sys
from pathlib import Path
from loader.api import load_checkpoint
from loader.options import LoadOptions
from core.errors import CheckpointError
folder = Path(sys.argv[1])
shard = sorted(folder.glob("*.safetensors"))[1]
def on_tensor(placed):
    if placed.index == 1:
        shard.write_bytes(b"")
try:
    load_checkpoint(folder, LoadOptions(mode=sys.argv[2]), on_tensor=on_tensor)
except CheckpointError as exc:
    print(exc)
    sys.exit(2)
"""


@pytest.mark.parametrize("mode", ["drain", "retain"])
def test_a_shard_truncated_while_mapped_is_one_line_not_a_sigbus(tmp_path, mode):
    folder = _write(tmp_path / "c", [{"a.weight": torch.ones(4096)}, {"c.weight": torch.ones(4096)}])
    result = subprocess.run([sys.executable, "-c", TRUNCATE_MID_DRAIN, str(folder), mode], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "the file changed or shrank while it was being read" in result.stdout
