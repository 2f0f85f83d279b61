"""The ring's pool of registered host buffers, against a fake of the CUDA driver (no GPU here; the `gpu`
tests in test_stream_ring.py run the real registration on the GPU host)."""

from __future__ import annotations

import mmap

import pytest
import torch

from loader.io.pinned import HostStaging, PinFailed, PinnedPool


class FakeDriver:
    """The two driver calls the pool makes, recording their arguments; `refuse` makes registration fail."""

    def __init__(self, refuse: int = 0):
        self.refuse = refuse
        self.contexts: list[int] = []
        self.registered: list[tuple[int, int, int]] = []

    def cuCtxSetCurrent(self, context):
        self.contexts.append(context)
        return 0

    def cuMemHostRegister_v2(self, address, size, flags):
        if self.refuse:
            return self.refuse
        self.registered.append((address, size, flags))
        return 0


def test_a_buffer_is_registered_once_with_the_callers_context_and_reused_after_it_is_given_back():
    driver = FakeDriver()
    pool = PinnedPool(lambda: driver)
    first = pool.take(1 << 20, context=7)
    assert first.numel() == 1 << 20 and first.dtype == torch.uint8
    assert first.data_ptr() % mmap.PAGESIZE == 0 and int(first.sum()) == 0
    assert driver.contexts == [7] and driver.registered == [(first.data_ptr(), 1 << 20, 1)]  # portable
    second = pool.take(1 << 20, context=7)
    assert second.data_ptr() != first.data_ptr() and len(driver.registered) == 2
    pool.give_back([first, first[: 1 << 20], torch.empty(1 << 20, dtype=torch.uint8)])  # a view counts once
    again = pool.take(1 << 20, context=7)
    assert again.data_ptr() == first.data_ptr() and len(driver.registered) == 2
    fresh = pool.take(1 << 20, context=7)
    assert fresh.data_ptr() not in (first.data_ptr(), second.data_ptr()) and len(driver.registered) == 3


def test_buffers_are_kept_by_size_and_a_part_of_one_is_not_taken_for_the_whole():
    pool = PinnedPool(lambda: FakeDriver())
    big = pool.take(2 << 20, context=1)
    pool.give_back([big[: 1 << 20]])
    assert pool.take(2 << 20, context=1).data_ptr() != big.data_ptr()
    pool.give_back([big])
    assert pool.take(1 << 20, context=1).data_ptr() != big.data_ptr()
    assert pool.take(2 << 20, context=1).data_ptr() == big.data_ptr()


def test_a_refused_registration_is_pin_failed_naming_the_size_and_the_driver_error():
    pool = PinnedPool(lambda: FakeDriver(refuse=2))
    with pytest.raises(PinFailed, match=r"page-locking 4096 bytes of host memory failed: CUDA driver error 2"):
        pool.take(4096, context=1)


def test_without_a_driver_library_nothing_registers():
    pool = PinnedPool(lambda: None)
    assert not pool.available()
    with pytest.raises(PinFailed, match="libcuda.so.1"):
        pool.take(4096, context=1)


def test_host_memory_that_cannot_be_mapped_is_pin_failed_too(monkeypatch):
    import errno

    import loader.io.pinned as pinned

    def refuse(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(pinned.mmap, "mmap", refuse)
    with pytest.raises(PinFailed, match="mapping 4096 bytes of host memory failed: Cannot allocate memory"):
        PinnedPool(lambda: FakeDriver()).take(4096, context=1)


class FakeTorchPinned:
    """torch's pinned allocator as the ring sees it: page-aligned memory, or a RuntimeError when `refuse`."""

    def __init__(self, refuse: bool = False):
        self.refuse = refuse
        self.sizes: list[int] = []

    def __call__(self, size: int) -> torch.Tensor:
        if self.refuse:
            raise RuntimeError("CUDA error: out of memory\nmore detail")
        self.sizes.append(size)
        return torch.frombuffer(mmap.mmap(-1, size), dtype=torch.uint8)


def test_staging_registers_while_the_driver_accepts():
    staging = HostStaging(PinnedPool(lambda: FakeDriver()), FakeTorchPinned())
    assert staging.allocate(4096, context=1) is not None
    assert staging.path == "registered" and staging.note == ""


def test_a_refused_registration_falls_back_to_torchs_pinned_allocator_never_to_pageable(caplog):
    """A GB10 refuses cuMemHostRegister (CUDA_ERROR_NOT_SUPPORTED, 801): the buffers come from torch's
    pinned allocator, and registration is not asked again for the next buffers."""
    driver, pinned = FakeDriver(refuse=801), FakeTorchPinned()
    staging = HostStaging(PinnedPool(lambda: driver), pinned)
    with caplog.at_level("WARNING", logger="loader.io.pinned"):
        buffers = [staging.allocate(1 << 16, context=1) for _ in range(3)]
    assert all(b is not None and b.numel() == 1 << 16 for b in buffers) and pinned.sizes == [1 << 16] * 3
    assert staging.path == "torch-pinned"
    assert staging.note == "registration refused (page-locking 65536 bytes of host memory failed: CUDA driver error 801); torch's pinned allocator instead"
    assert len(driver.contexts) == 1 and len(caplog.records) == 1  # one refusal, logged once


def test_pageable_only_when_both_refuse_and_the_note_says_both():
    staging = HostStaging(PinnedPool(lambda: FakeDriver(refuse=801)), FakeTorchPinned(refuse=True))
    assert staging.allocate(4096, context=1) is None and staging.path == "pageable"
    assert "registration refused" in staging.note
    assert staging.note.endswith("torch's pinned allocator refused (CUDA error: out of memory); pageable memory")


def test_without_a_driver_context_torchs_allocator_is_used_and_the_note_says_why():
    pinned = FakeTorchPinned()
    staging = HostStaging(PinnedPool(lambda: None), pinned)
    assert staging.allocate(4096, context=None) is not None and staging.path == "torch-pinned"
    assert "no CUDA driver context" in staging.note and pinned.sizes == [4096]


class UnregisteringDriver(FakeDriver):
    """The fake with the unregister call too; `keep` lists addresses it refuses to unregister."""

    def __init__(self, keep: tuple[int, ...] = ()):
        super().__init__()
        self.keep = set(keep)
        self.unregistered: list[int] = []

    def cuMemHostUnregister(self, address):
        if address in self.keep:
            return 1
        self.unregistered.append(address)
        return 0


def test_release_free_unregisters_only_the_buffers_given_back_and_forgets_them():
    driver = UnregisteringDriver()
    pool = PinnedPool(lambda: driver)
    held, given = pool.take(1 << 20, context=3), pool.take(1 << 20, context=3)
    pool.give_back([given])
    address = given.data_ptr()
    del given
    assert pool.release_free(context=3) == 1 << 20
    assert driver.unregistered == [address] and driver.contexts[-1] == 3
    assert pool.release_free(context=3) == 0  # nothing left to release; the held one is untouched
    again = pool.take(1 << 20, context=3)  # registered anew: the released one is gone from the pool
    assert len(driver.registered) == 3 and again.data_ptr() != held.data_ptr()


def test_a_buffer_the_driver_keeps_registered_stays_free_for_the_next_take():
    driver = UnregisteringDriver()
    pool = PinnedPool(lambda: driver)
    buffer = pool.take(1 << 20, context=1)
    driver.keep.add(buffer.data_ptr())
    pool.give_back([buffer])
    assert pool.release_free(context=1) == 0 and driver.unregistered == []
    assert pool.take(1 << 20, context=1).data_ptr() == buffer.data_ptr() and len(driver.registered) == 1
    assert pool.release_free(context=None) == 0  # no context: nothing is attempted
