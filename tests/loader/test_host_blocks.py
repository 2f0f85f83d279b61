"""Page-locked host placement (`pin_host`): the packing arithmetic, the arena carving tensors from its blocks,
and a load through it. No GPU here: torch's pinned allocator is faked by ordinary tensors where the test needs
blocks, and used for real where the test needs its refusal (this CPU build has no pinned allocator). On the GPU
host, `test_a_pinned_host_load_is_pinned_copies_to_the_gpu_and_gives_its_blocks_back` checks the real allocator."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import loader.io.host_blocks as host_blocks
from loader import LoadOptions, load_checkpoint
from loader.io.host_blocks import ALIGN, BLOCK_BYTES, BlockPacker, PinnedHostArena, packed_bytes

MiB = 1 << 20


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def test_tensors_are_packed_first_fit_into_power_of_two_blocks_with_none_rounded_on_its_own():
    sizes = [300 * MiB, 700 * MiB, 500 * MiB, 200 * MiB, 20 * MiB]  # 1.68 GiB
    packer = BlockPacker(sum(sizes))
    slots = [packer.place(n) for n in sizes]
    assert [(s.block, s.offset) for s in slots] == [(0, 0), (0, 300 * MiB), (1, 0), (1, 500 * MiB), (0, 1000 * MiB)]
    assert packer.blocks == [BLOCK_BYTES, BLOCK_BYTES]  # the 20 MiB tensor filled the first block's gap
    # each tensor pinned on its own would take 512 + 1024 + 512 + 256 + 32 MiB
    assert packer.total == 2048 * MiB < sum(1 << (n - 1).bit_length() for n in sizes)


def test_a_small_model_gets_a_block_of_its_own_size_and_a_large_tensor_one_of_its_size():
    assert packed_bytes([10 * MiB, 20 * MiB, 12 * MiB]) == 64 * MiB  # not a whole GiB for a 42 MiB model
    packer = BlockPacker(3 * BLOCK_BYTES)
    assert packer.place(2 * BLOCK_BYTES + 1).new_block == 4 * BLOCK_BYTES
    assert packer.place(BLOCK_BYTES - 1).block == 0  # fits beside it
    assert all(_is_power_of_two(b) for b in packer.blocks)


def test_each_tensor_starts_aligned_within_its_block():
    packer = BlockPacker(10_000)
    offsets = [packer.place(n).offset for n in (1, ALIGN + 1, 3)]
    assert offsets == [0, ALIGN, 3 * ALIGN] and packer.blocks == [16384]


class FakePinned:
    """torch's pinned allocator as ordinary tensors, recording the sizes asked for; `fail_after` refuses then."""

    def __init__(self, fail_after: int | None = None):
        self.sizes: list[int] = []
        self.fail_after = fail_after

    def __call__(self, size: int) -> torch.Tensor:
        if self.fail_after is not None and len(self.sizes) >= self.fail_after:
            raise RuntimeError("CUDA error: out of memory\nmore detail")
        self.sizes.append(size)
        return torch.zeros(size, dtype=torch.uint8)


def test_the_arena_carves_each_tensor_from_a_block_and_the_block_lives_as_long_as_any_of_them():
    fake = FakePinned()
    arena = PinnedHostArena(4 * 64 * 3 + 2 * 8, pinned=fake)
    a = arena.empty((64, 3), torch.float32)  # 768 bytes
    b = arena.empty((8,), torch.bfloat16)
    assert fake.sizes == [1024] and arena.pinned_bytes == 1024 and not arena.note
    assert a.shape == (64, 3) and a.dtype == torch.float32 and b.dtype == torch.bfloat16
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert b.data_ptr() - a.data_ptr() == 768
    a.fill_(1.5)
    b.fill_(2.0)
    assert float(a.sum()) == 1.5 * 192 and float(b.sum()) == 16.0  # distinct bytes, no overlap
    arena.release()
    assert b.untyped_storage().nbytes() == 1024  # the block outlives the arena through its tensors


def test_where_pinning_is_refused_the_rest_goes_to_pageable_memory_and_the_note_says_why():
    arena = PinnedHostArena(3 * BLOCK_BYTES, pinned=FakePinned(fail_after=1), block_bytes=1024)
    first = arena.empty((256,), torch.float32)  # fills the first 1 KiB block
    second = arena.empty((256,), torch.float32)  # a second block is refused
    third = arena.empty((4,), torch.float32)
    assert arena.pinned_bytes == 1024
    assert "pinning a 1024-byte host block failed (CUDA error: out of memory)" == arena.note
    assert second.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
    assert third.untyped_storage().nbytes() == 16  # pageable, its own


def _dit(h3_root: Path) -> Path:
    return h3_root / "transformer"


def test_a_pinned_host_load_places_the_same_values_in_views_of_a_few_blocks(h3_root: Path, monkeypatch):
    fake = FakePinned()
    monkeypatch.setattr(host_blocks, "torch_pinned", fake)
    monkeypatch.setattr(host_blocks, "_register_mode", False)  # leave a real GPU host's allocator as it is
    plain, _ = load_checkpoint(h3_root, LoadOptions(component="transformer", skeleton=True))
    pinned, report = load_checkpoint(h3_root, LoadOptions(component="transformer", skeleton=True, pin_host=True))
    blocks = {t.untyped_storage().data_ptr() for t in pinned.state_dict().values()}
    assert len(blocks) == len(fake.sizes) and report.host_pinned_bytes == sum(fake.sizes) and not report.host_pinned_note
    sizes = [t.nbytes for t in pinned.state_dict().values()]
    assert report.host_pinned_bytes == packed_bytes(sizes)
    for name, tensor in plain.state_dict().items():
        assert torch.equal(pinned.state_dict()[name], tensor), name


def test_without_a_pinned_allocator_a_pinned_host_load_is_pageable_and_says_why(h3_root: Path):
    if torch.cuda.is_available():
        pytest.skip("this CPU-only check needs torch's pinned allocator to refuse")
    module, report = load_checkpoint(h3_root, LoadOptions(component="transformer", skeleton=True, pin_host=True))
    assert report.host_pinned_bytes == 0
    assert "pinned" in report.host_pinned_note and "failed" in report.host_pinned_note
    assert report.tensors_placed == len(module.state_dict())


@pytest.mark.gpu
def test_a_pinned_host_load_is_pinned_copies_to_the_gpu_and_gives_its_blocks_back(h3_root: Path):
    """On CUDA: every tensor is pinned, `pin_memory()` returns it unchanged (so diffusers' group offload pins
    nothing twice) and torch's host allocator holds the blocks alone."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.cuda.synchronize()
    module, report = load_checkpoint(h3_root, LoadOptions(component="transformer", skeleton=True, pin_host=True))
    assert report.host_pinned_bytes > 0 and not report.host_pinned_note
    for name, t in module.state_dict().items():
        assert t.is_pinned(), name
        assert t.pin_memory().data_ptr() == t.data_ptr(), name
    copied = [t.to("cuda", non_blocking=True) for t in module.state_dict().values()]
    torch.cuda.synchronize()
    assert all(torch.equal(c.cpu(), t) for c, t in zip(copied, module.state_dict().values()))
    print(f"host registration: {host_blocks._register_mode}; {report.host_pinned_bytes} bytes pinned")
    del module, copied, t  # `t`: the loop's last tensor, a view of a block
    import gc

    gc.collect()
    host_blocks.release_cached_host_memory()
    stats = torch.cuda.host_memory_stats()
    assert stats["num_host_alloc"] == stats["num_host_free"]  # every block went back to the system


class FakeTorchPinning:
    """torch's pinned allocator and its settings as the switch sees them: `refuse_registration` fails a block
    while host registration is on (a GB10 refuses it); `held` blocks exist from before."""

    def __init__(self, refuse_registration: bool = False, held: int = 0):
        self.settings: list[str] = []
        self.refuse_registration = refuse_registration
        self.held = held
        self.blocks: list[tuple[int, bool]] = []

    @property
    def registering(self) -> bool:
        return bool(self.settings) and self.settings[-1].startswith("pinned_use_cuda_host_register:True")

    def set(self, settings: str) -> None:
        self.settings.append(settings)

    def stats(self) -> dict:
        return {"num_host_alloc": self.held + len(self.blocks), "num_host_free": 0}

    def pinned(self, size: int) -> torch.Tensor:
        if self.registering and self.refuse_registration:
            raise RuntimeError("CUDA error: operation not supported\nmore")
        self.blocks.append((size, self.registering))
        return torch.zeros(size, dtype=torch.uint8)


@pytest.fixture
def fake_pinning(monkeypatch):
    def install(**kwargs) -> FakeTorchPinning:
        fake = FakeTorchPinning(**kwargs)
        monkeypatch.setattr(host_blocks, "_register_mode", None)
        monkeypatch.setattr(host_blocks, "torch_pinned", fake.pinned)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "host_memory_stats", fake.stats, raising=False)
        monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", fake.set, raising=False)
        monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
        monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
        return fake
    return install


def test_pinning_switches_once_to_threaded_host_registration_while_torch_holds_no_pinned_block(fake_pinning):
    fake = fake_pinning()
    assert host_blocks.prefer_host_registration() and host_blocks.prefer_host_registration()
    host_blocks.torch_pinned(1024)
    host_blocks.torch_pinned(2048)
    assert len(fake.settings) == 1
    threads = int(fake.settings[0].rsplit(":", 1)[1])
    assert threads & (threads - 1) == 0 and 1 <= threads <= 16  # torch takes a power of two
    assert fake.blocks == [(host_blocks.ALIGN, True), (1024, True), (2048, True)]  # a probe block first


def test_pinning_stays_on_cudahostalloc_where_torch_already_holds_a_block_or_the_user_set_pinned_options(
        fake_pinning, monkeypatch):
    fake = fake_pinning(held=1)  # freeing that block as a registered one would fail
    assert host_blocks.prefer_host_registration() is False
    host_blocks.torch_pinned(1024)
    assert fake.settings == [] and fake.blocks == [(1024, False)]
    fake = fake_pinning()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "pinned_num_register_threads:4")
    assert host_blocks.prefer_host_registration() is False
    host_blocks.torch_pinned(1024)
    assert fake.settings == [] and fake.blocks == [(1024, False)]


def test_where_host_registration_is_refused_the_switch_is_undone_and_cudahostalloc_serves(fake_pinning):
    fake = fake_pinning(refuse_registration=True)
    assert host_blocks.prefer_host_registration() is False
    first = host_blocks.torch_pinned(1024)
    assert first.numel() == 1024
    assert fake.settings[-1] == "pinned_use_cuda_host_register:False" and len(fake.settings) == 2
    assert fake.blocks == [(1024, False)]
