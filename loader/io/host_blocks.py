"""Page-locked host tensors for a module that a GPU will copy from, packed into a few large pinned blocks.

Why: diffusers' group offload with pinned CPU memory pins each DiT tensor
on its own, and torch's caching host allocator rounds every block up to a
power of two, so H3's 61.7 GiB DiT took 90.2 GiB of host memory, beside the
pageable copy the loader had placed (measured on one H200, see
docs/benchmarks.md). Placed here instead, each tensor is a view into a block
that is itself a power of two (nothing lost to rounding), the blocks are
filled first-fit, and `pin_memory()` of a pinned tensor returns it
unchanged, so group offload pins nothing twice.

`BlockPacker` is the arithmetic alone, shared by the arena and the forecast
(`models.forecast`), so both count the same bytes. A block lives as long as
any tensor carved from it; freed, it goes back to torch's host cache
(`release_cached_host_memory` hands that back to the system).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .pinned import POOL, current_context, torch_pinned

log = logging.getLogger(__name__)

BLOCK_BYTES = 1 << 30
"""A block's size while at least this much is left to place (a power of two: torch's allocator takes it whole)."""
ALIGN = 256
"""Every tensor starts on a multiple of this within its block (as in torch's CUDA allocator, whose blocks are
multiples of 512: any dtype's view and the copy engines' fast path)."""


def next_power_of_two(nbytes: int) -> int:
    return 1 << max(nbytes - 1, 0).bit_length()


def user_allocator_settings() -> str:
    """The allocator settings the user gave torch (PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF, joined)."""
    return ",".join(os.environ.get(k, "") for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"))


@dataclass
class Slot:
    """Where one tensor goes: block `block` at byte `offset`; `new_block` is the block's size when this
    tensor opens it (0 when it fits in an open block)."""

    block: int
    offset: int
    new_block: int


class BlockPacker:
    """First-fit packing of tensors, in the order given, into power-of-two blocks.

    A new block is BLOCK_BYTES, or the next power of two of what is left to
    place when that is smaller (a 42 MB model takes one 64 MiB block, not a
    GiB), or of the tensor itself when it is larger.
    """

    def __init__(self, total: int, block_bytes: int = BLOCK_BYTES):
        self.left = total
        """Bytes not placed yet (the caller's total less what `place` was given)."""
        self.block_bytes = block_bytes
        self.blocks: list[int] = []
        """Each block's size, in the order opened."""
        self._used: list[int] = []

    def place(self, nbytes: int) -> Slot:
        self.left = max(self.left - nbytes, 0)
        for i, size in enumerate(self.blocks):
            offset = -(-self._used[i] // ALIGN) * ALIGN
            if offset + nbytes <= size:
                self._used[i] = offset + nbytes
                return Slot(i, offset, 0)
        size = max(next_power_of_two(nbytes), min(self.block_bytes, next_power_of_two(self.left + nbytes)))
        self.blocks.append(size)
        self._used.append(nbytes)
        return Slot(len(self.blocks) - 1, 0, size)

    @property
    def total(self) -> int:
        """Host bytes the blocks take."""
        return sum(self.blocks)


def packed_bytes(sizes: Iterable[int]) -> int:
    """What a `PinnedHostArena` takes for tensors of `sizes`, placed in that order."""
    sizes = list(sizes)
    packer = BlockPacker(sum(sizes))
    for n in sizes:
        packer.place(n)
    return packer.total


class PinnedHostArena:
    """Host tensors carved from pinned blocks (`empty`); pageable, with `note` saying why, where pinning is
    refused (no CUDA, or the allocator fails), from the refusal on."""

    def __init__(self, total: int, pinned: Callable[[int], torch.Tensor] | None = None,
                 block_bytes: int = BLOCK_BYTES):
        self._packer = BlockPacker(total, block_bytes)
        self._pinned = pinned or torch_pinned
        self._blocks: list[torch.Tensor] = []
        self.pinned_bytes = 0
        """Bytes of the pinned blocks allocated."""
        self.note = ""
        """Why tensors went to pageable memory, where some did."""

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        if not self.note:
            slot = self._packer.place(nbytes)
            if slot.new_block:
                try:
                    self._blocks.append(self._pinned(slot.new_block))
                    self.pinned_bytes += slot.new_block
                except RuntimeError as exc:
                    self.note = f"pinning a {slot.new_block}-byte host block failed ({str(exc).splitlines()[0]})"
                    log.warning("host placement: %s; pageable memory from here on", self.note)
            if not self.note:
                block = self._blocks[slot.block]
                return block[slot.offset : slot.offset + nbytes].view(dtype).view(shape)
        return torch.empty(shape, dtype=dtype)

    def release(self) -> None:
        """Drop the arena's own references: each block then lives exactly as long as its tensors."""
        self._blocks = []


_REGISTER_ON = "pinned_use_cuda_host_register:True,pinned_num_register_threads:{threads}"
_REGISTER_OFF = "pinned_use_cuda_host_register:False"
_register_mode: bool | None = None
"""Whether torch's pinned allocator was switched to host registration in this process (None: not tried)."""


def prefer_host_registration() -> bool:
    """Switch torch's pinned allocator, once per process, to page memory in on several threads and register it
    (`pinned_use_cuda_host_register`) rather than cudaHostAlloc, which pins one page at a time: 8 GiB in 0.89
    s against 4.83 s on one H200 (docs/benchmarks.md, Pinning host memory). Whether it is switched.

    torch frees a block by the setting in force when it frees it, so the switch is made only while torch's
    pinned allocator holds no block at all (a process's entry point makes it, `loader.process`: asked for at
    the DiT's load it was not made, some pinned memory existing by then) and is never undone once made; where the user set pinned
    options (PYTORCH_CUDA_ALLOC_CONF) they stand. A first small block proves registration works here; where
    it is refused (a GB10 refuses host registration) the switch is undone and cudaHostAlloc serves.
    """
    global _register_mode
    if _register_mode is None:
        _register_mode = _switch_to_registration()
    return _register_mode


def _switch_to_registration() -> bool:
    conf = user_allocator_settings()
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if "pinned_" in conf or stats is None or not torch.cuda.is_available():
        return False
    held = stats()
    if held.get("num_host_alloc", 1) != held.get("num_host_free", 0):
        return False  # blocks cudaHostAlloc made would then be freed as registered ones
    threads = 1 << max(min(16, os.cpu_count() or 1).bit_length() - 1, 0)  # a power of two, as torch requires
    if not _set_allocator(_REGISTER_ON.format(threads=threads)):
        return False
    try:
        torch_pinned(ALIGN)  # kept in torch's cache, freed as the registered block it is
    except RuntimeError as exc:
        # Expected where the device refuses it (a GB10), and every CUDA process now asks at its start: not a warning.
        log.info("host registration refused (%s); torch's cudaHostAlloc instead", str(exc).splitlines()[0])
        _set_allocator(_REGISTER_OFF)
        return False
    return True


def _set_allocator(settings: str) -> bool:
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:
        return False
    try:
        setter(settings)
    except RuntimeError as exc:
        log.warning("torch refused allocator settings %r: %s", settings, exc)
        return False
    return True


def release_cached_host_memory() -> int:
    """Hand the page-locked host memory no tensor holds back to the system: torch's cached pinned blocks (a
    released offloaded DiT's, a ring's where registration is refused) and the load rings' registered buffers
    (`loader.io.pinned.POOL`). Returns the registered bytes released (torch does not say how much it freed)."""
    if not torch.cuda.is_available():
        return 0
    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()
    return POOL.release_free(current_context())
