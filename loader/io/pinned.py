"""Page-locked host buffers for the CUDA ring, registered with the driver beside the load and kept for the next.

Why not torch's pinned allocator: `cudaHostAlloc` holds the driver while it
pins, so a helper thread pinning the ring's buffers stalled the loader's
own copies for as long as it took. Memory the kernel faults in first (the
mapping's own `MAP_POPULATE`) and that is then registered with
`cuMemHostRegister` takes as long to pin, but the copies run beside it: the
ring copies through its first buffer while the others are pinned (see
docs/benchmarks.md, Ring settings on one H200).

Like torch's pinned allocator, the pool keeps its buffers for the process's
next load (a generate job loads several components), so only a process's
first load pays for pinning, until `release_free` unregisters and unmaps
those given back: a run that releases each component after its stages
(sequential residency) does so after every load, so the ring's 0.6-1 GiB is
not held through the stages that compute. A buffer registered for a load
that ended without giving it back stays held: unmapped while registered, its
address could not be registered again.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import threading
from collections.abc import Callable, Iterable

import torch

from .cuda_copy import _driver

log = logging.getLogger(__name__)

_CUDA_SUCCESS = 0
_REGISTER_PORTABLE = 1
"""CU_MEMHOSTREGISTER_PORTABLE: page-locked for every context, so a kept buffer serves a later load on any device."""


class PinFailed(RuntimeError):
    """The driver refused to page-lock a buffer (the message says why); fall back to torch's pinned memory."""


class PinnedPool:
    """Registered host buffers by size: `take` one (kept from an earlier load, else registered now) and
    `give_back` them after the load. Safe to call from any thread."""

    def __init__(self, driver: Callable[[], object | None] = _driver):
        self._driver = driver
        self._lock = threading.Lock()
        self._registered: dict[int, torch.Tensor] = {}
        """Every buffer this pool registered, by address, held for the life of the process."""
        self._free: dict[int, set[int]] = {}
        """Addresses of the buffers given back, by size."""

    def available(self) -> bool:
        """Whether buffers can be registered here (the CUDA driver library loads)."""
        return self._driver() is not None

    def take(self, size: int, context: int) -> torch.Tensor:
        """A page-locked, page-aligned uint8 buffer of `size` bytes: one given back earlier, else one
        registered now with CUDA context `context` made current on the calling thread. PinFailed where
        the driver refuses."""
        with self._lock:
            free = self._free.get(size)
            if free:
                return self._registered[free.pop()]
        buffer = self._register(size, context)
        with self._lock:
            self._registered[buffer.data_ptr()] = buffer
        return buffer

    def give_back(self, buffers: Iterable[torch.Tensor]) -> None:
        """Make the buffers this pool registered free for the next `take` (views of one count once);
        others (torch's pinned or pageable memory) are ignored."""
        with self._lock:
            for b in buffers:
                mine = self._registered.get(b.data_ptr())
                if mine is not None and b.numel() == mine.numel():
                    self._free.setdefault(mine.numel(), set()).add(b.data_ptr())

    def release_free(self, context: int | None) -> int:
        """Unregister and unmap every buffer given back (none is in use), with CUDA context `context` made
        current on the calling thread; returns the bytes handed back to the system. A buffer the driver will
        not unregister stays registered, free for the next `take`; with no context nothing is released."""
        lib = self._driver()
        if lib is None or context is None:
            return 0
        with self._lock:
            if not any(self._free.values()) or lib.cuCtxSetCurrent(context) != _CUDA_SUCCESS:
                return 0
            released = 0
            for free in self._free.values():
                for address in list(free):
                    if lib.cuMemHostUnregister(address) == _CUDA_SUCCESS:
                        free.discard(address)
                        released += self._registered.pop(address).numel()  # the last reference: the mapping goes
            return released

    def _register(self, size: int, context: int) -> torch.Tensor:
        lib = self._driver()
        if lib is None:
            raise PinFailed("the CUDA driver library (libcuda.so.1) is not loadable")
        try:
            # Faulted in by the mapping call itself, which releases the GIL and beat mapping first and
            # populating after (see docs/benchmarks.md, Ring settings on one H200).
            area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
        except OSError as exc:
            raise PinFailed(f"mapping {size} bytes of host memory failed: {exc.strerror}") from None
        buffer = torch.frombuffer(area, dtype=torch.uint8)  # holds the mapping as long as the tensor lives
        result = lib.cuCtxSetCurrent(context)
        if result == _CUDA_SUCCESS:
            result = lib.cuMemHostRegister_v2(buffer.data_ptr(), size, _REGISTER_PORTABLE)
        if result != _CUDA_SUCCESS:
            raise PinFailed(f"page-locking {size} bytes of host memory failed: CUDA driver error {result}")
        return buffer


def torch_pinned(size: int) -> torch.Tensor:
    """`size` bytes from torch's pinned allocator (cudaHostAlloc): page-aligned, rounded up to a power of two."""
    return torch.empty(size, dtype=torch.uint8, pin_memory=True)


class HostStaging:
    """Where a ring's host buffers come from, in order of preference, remembering what was refused.

    Registered buffers (`PinnedPool`) first: they let the copies run while
    the rest are pinned. Where the driver refuses registration (a GB10
    refuses cuMemHostRegister) torch's pinned allocator instead, never
    pageable memory at once: a ring on pageable buffers is several times
    slower, torch's pinned ones nearly as fast as registered (see
    docs/benchmarks.md, Loader peers on one H200). Pageable (`allocate`
    returns None) only when both refuse.
    Each refusal is logged once and kept in `note`; later buffers skip that
    path. Used from one thread at a time (the ring's pinning helper).
    """

    def __init__(self, pool: "PinnedPool", pinned: Callable[[int], torch.Tensor] = torch_pinned):
        self._pool = pool
        self._pinned = pinned
        self.path = ""
        """The last buffer's: "registered", "torch-pinned" or "pageable" ("" before the first)."""
        self.note = ""
        """Why buffers are not registered, where they are not (each refusal, in order)."""
        self._register = True
        self._torch = True

    def allocate(self, size: int, context: int | None) -> torch.Tensor | None:
        """A page-locked buffer of at least `size` bytes, or None where both ways refused (the caller
        then allocates pageable memory). `context` None (no driver context) skips registration."""
        if context is None and self._register:
            self._register = False
            self._refused("no CUDA driver context to register with (libcuda.so.1 not loadable?)")
        if self._register:
            try:
                buffer = self._pool.take(size, context)
                self.path = "registered"
                return buffer
            except PinFailed as exc:
                self._register = False
                self._refused(f"registration refused ({exc}); torch's pinned allocator instead")
        if self._torch:
            try:
                buffer = self._pinned(size)
                self.path = "torch-pinned"
                return buffer
            except RuntimeError as exc:
                self._torch = False
                self._refused(f"torch's pinned allocator refused ({str(exc).splitlines()[0]}); pageable memory")
        self.path = "pageable"
        return None

    def _refused(self, note: str) -> None:
        self.note = f"{self.note}; {note}" if self.note else note
        log.warning("ring staging: %s", note)


def current_context() -> int | None:
    """The CUDA context current on the calling thread (for `PinnedPool.take` on a helper), or None."""
    lib = _driver()
    if lib is None:
        return None
    context = ctypes.c_void_p()
    if lib.cuCtxGetCurrent(ctypes.byref(context)) != _CUDA_SUCCESS or not context.value:
        return None
    return context.value


POOL = PinnedPool()
"""The process's pool, shared by every load."""
