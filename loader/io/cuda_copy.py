"""Host-to-device copies queued through the CUDA driver API, without torch's per-copy dispatch.

Why: `stream`'s CUDA ring queues about 1,800 copies for a 37 GiB model, all
from the loader's one Python thread. Each `Tensor.copy_` under a
`torch.cuda.stream` context went through slicing, the dispatcher and a
stream switch; `cuMemcpyHtoDAsync` through ctypes is one foreign call that
releases the GIL. The driver library (`libcuda.so.1`) is the one every CUDA
program loads; nothing here is compiled.

The driver queues a copy on the context current on the calling thread, so
`DriverCopier.for_device` only hands out a copier when that context is the
target device's (torch makes it current inside `torch.cuda.device(...)`).
Callers fall back to torch's copies where it returns None.

The copy streams come from the driver too (`copy_streams_for`): a process's first
`torch.cuda.Stream` creates torch's whole stream pool, all of it before the
ring's first copy (see docs/benchmarks.md, Ring settings on one H200).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from core.errors import PlacementError

_CUDA_SUCCESS = 0
_STREAM_NON_BLOCKING = 1
"""CU_STREAM_NON_BLOCKING: no implicit synchronisation with the legacy default stream (as torch's pool streams)."""

_KEPT_STREAMS: dict[int, list[torch.cuda.Stream]] = {}
"""Driver-created copy streams by device index, kept for the process's later loads (never destroyed)."""


@functools.cache
def _driver() -> ctypes.CDLL | None:
    """The driver library with the calls used here and by `loader.io.pinned` declared (loaded once), or None without one."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    lib.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.cuMemcpyHtoDAsync_v2.restype = ctypes.c_int
    lib.cuCtxGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.cuCtxGetDevice.restype = ctypes.c_int
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuGetErrorName.restype = ctypes.c_int
    lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.cuCtxGetCurrent.restype = ctypes.c_int
    lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    lib.cuCtxSetCurrent.restype = ctypes.c_int
    lib.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    lib.cuMemHostRegister_v2.restype = ctypes.c_int
    lib.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
    lib.cuMemHostUnregister.restype = ctypes.c_int
    lib.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    lib.cuStreamCreate.restype = ctypes.c_int
    return lib


def copy_streams_for(device: torch.device, count: int) -> list[torch.cuda.Stream]:
    """`count` streams for copies onto CUDA `device`, each ordered after the work already queued on the
    device's current stream: created through the driver in the device's context and kept for later
    loads, else (no driver library, or it refuses) from torch's pool."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    lib = _driver()
    kept = _KEPT_STREAMS.setdefault(index, [])
    with torch.cuda.device(index):
        current = ctypes.c_int(-1)
        own_context = lib is not None and lib.cuCtxGetDevice(ctypes.byref(current)) == _CUDA_SUCCESS and current.value == index
        while own_context and len(kept) < count:
            handle = ctypes.c_void_p()
            if lib.cuStreamCreate(ctypes.byref(handle), _STREAM_NON_BLOCKING) != _CUDA_SUCCESS:
                break
            kept.append(torch.cuda.ExternalStream(handle.value, device=torch.device("cuda", index)))
        streams = kept[:count] if len(kept) >= count else [torch.cuda.Stream(index) for _ in range(count)]
        for s in streams:
            s.wait_stream(torch.cuda.current_stream(index))
    return streams


class DriverCopier:
    """Queues pinned-host-to-device copies on one CUDA stream of the current context."""

    def __init__(self, lib: ctypes.CDLL, stream: torch.cuda.Stream):
        self._copy = lib.cuMemcpyHtoDAsync_v2
        self._lib = lib
        self._stream = ctypes.c_void_p(stream.cuda_stream)

    @classmethod
    def for_device(cls, device: torch.device, stream: torch.cuda.Stream) -> "DriverCopier | None":
        """A copier onto `stream`, or None where the driver library or the device's context is not at hand."""
        lib = _driver()
        if lib is None:
            return None
        current = ctypes.c_int(-1)
        index = device.index if device.index is not None else torch.cuda.current_device()
        if lib.cuCtxGetDevice(ctypes.byref(current)) != _CUDA_SUCCESS or current.value != index:
            return None
        return cls(lib, stream)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Queue `nbytes` from host address `src` to device address `dst` (asynchronous when `src` is pinned)."""
        result = self._copy(dst, src, nbytes, self._stream)
        if result != _CUDA_SUCCESS:
            name = ctypes.c_char_p()
            self._lib.cuGetErrorName(result, ctypes.byref(name))
            label = name.value.decode() if name.value else f"error {result}"
            raise PlacementError(f"host-to-device copy of {nbytes} bytes to 0x{dst:x} failed: {label}")
