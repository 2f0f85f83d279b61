"""Fixtures shared across packages: small deterministic safetensors checkpoints, small filesystems."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Iterator

import pytest
import torch

from loader.safetensors_file import write_tensors

os.environ["HF_HUB_OFFLINE"] = "1"  # the test process is an entry point too: no test contacts a model hub

ShardSpec = dict[str, torch.Tensor]


@dataclass
class TinyCheckpoint:
    """A component folder and the exact tensors written into it."""

    path: Path
    tensors: dict[str, torch.Tensor]
    shards: list[ShardSpec]


def tiny_shards(seed: int = 0) -> list[ShardSpec]:
    """Three shards of small random tensors (never zeros, which hide wrong copies):
    1. q and k projections (bf16) and a norm (fp32);
    2. the v projection (bf16), an fp16 feed-forward weight and an int64 step table;
    3. fp32 `proj_in` weight and bias.
    """
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) + 0.5).to(dtype)

    return [
        {
            "blocks.0.attn.to_q.weight": rand(8, 16, dtype=torch.bfloat16),
            "blocks.0.attn.to_k.weight": rand(8, 16, dtype=torch.bfloat16),
            "blocks.0.norm.weight": rand(16),
        },
        {
            "blocks.0.attn.to_v.weight": rand(8, 16, dtype=torch.bfloat16),
            "blocks.1.ff.weight": rand(32, 16, dtype=torch.float16),
            "steps": torch.randint(1, 1000, (3,), generator=g),
        },
        {"proj_in.weight": rand(16, 4), "proj_in.bias": rand(16)},
    ]


@pytest.fixture(autouse=True)
def _no_hugging_face_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the Hugging Face cache at a folder that does not exist, so a cache on the machine running the tests
    (`~/.cache/huggingface/hub`, a model root by default) never becomes one more root; tests of the cache set
    their own."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path_factory.getbasetemp() / "no-hugging-face-cache"))


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> TinyCheckpoint:
    """Component folder `tiny/` with three shards and an index (layout in `tiny_shards`)."""
    shards = tiny_shards()
    path = write_tensors(tmp_path_factory.mktemp("ckpt") / "tiny", shards)
    return TinyCheckpoint(path, {k: v for s in shards for k, v in s.items()}, shards)


@pytest.fixture
def component_writer(tmp_path: Path) -> Callable[..., Path]:
    """`write(shards, name="c")` writes a fresh component folder under tmp_path."""

    def write(shards: list[ShardSpec], name: str = "c", **kwargs) -> Path:
        return write_tensors(tmp_path / name, shards, **kwargs)

    return write


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """`mount(size_bytes, name="small")` mounts a fresh tmpfs of that size at tmp_path/name
    (a disk that really fills up, ENOSPC and all); unmounted after the test.

    Needs root (CI and the dev box run as root): a refused mount fails the test, it does not skip it.
    """
    mounted: list[Path] = []

    def mount(size_bytes: int, name: str = "small") -> Path:
        point = tmp_path / name
        point.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(point)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.fail(f"cannot mount a {size_bytes}-byte tmpfs at {point} (the disk-full tests need root): "
                        f"{done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        if subprocess.run(["umount", str(point)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)


@pytest.fixture
def hold_write_lock() -> Iterator[Callable[..., subprocess.Popen]]:
    """`hold(db_path, seconds)` starts another process that takes the database's write lock (`BEGIN IMMEDIATE`),
    returns once it holds it, and commits after `seconds`; on release it prints whether the file
    `drainboard.db.locked` existed just before (what the System page reads)."""
    started: list[subprocess.Popen] = []

    def hold(db_path: Path, seconds: float) -> subprocess.Popen:
        script = (
            "import os, sqlite3, sys, time\n"
            "path, seconds = sys.argv[1], float(sys.argv[2])\n"
            "conn = sqlite3.connect(path, isolation_level=None)\n"
            "conn.execute('BEGIN IMMEDIATE')\n"
            "print('held', flush=True)\n"
            "time.sleep(seconds)\n"
            "print('notice' if os.path.exists(path + '.locked') else 'no notice', flush=True)\n"
            "conn.execute('COMMIT')\n"
        )
        process = subprocess.Popen([sys.executable, "-c", script, str(db_path), str(seconds)],
                                   stdout=subprocess.PIPE, text=True)
        started.append(process)
        assert process.stdout.readline().strip() == "held"
        return process

    yield hold
    for process in started:
        process.kill()
        process.wait()


@pytest.fixture
def one_accelerator(monkeypatch):
    """This process and every Python process it starts see one accelerator of type cpu: diffusers 0.42.1's
    `enable_parallelism` divides by `torch.accelerator.device_count()`, 0 on a CPU-only torch, before any collective
    (tests/fake_accelerator/sitecustomize.py says why). Only that count changes."""
    import os

    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 1)
    fake = str(Path(__file__).parent / "fake_accelerator")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (fake, os.environ.get("PYTHONPATH")) if p))
