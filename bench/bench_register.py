"""Benchmark (not a test): host-to-device copies straight from the page cache, through registered mappings.

The ring copies every byte twice on the host side of the bus: the page cache
into pinned staging (a CPU read and write) and staging to the device (a DMA
read). On the H200 host the memory system, not the bus, ran out first: 16
reader threads alone read 88.6 GB/s, and beside them 16 MiB copies fell from
54.9 to 22.6 GB/s. Registering a window of a read-only file mapping with
the CUDA driver (`cuMemHostRegister`, read-only) lets the copy engine read
the page-cache pages themselves, so each byte is read once. This measures
that pipeline: helper threads register windows ahead, the main thread queues
each window's copy, windows are unregistered and unmapped once their copy
has passed.

    python bench/bench_register.py /tmp/pruned-r16 [/dev/shm/pruned-r16] --window-mib 64 256 --helpers 2 4
"""
from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loader.cuda_copy import _driver  # noqa: E402

_MiB = 1024 * 1024
_READ_ONLY = 0x08  # CU_MEMHOSTREGISTER_READ_ONLY
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_cu = _driver()
"""The loader's driver library (cuMemcpyHtoDAsync declared there); `_declare` adds the calls it does not make."""


def _declare() -> None:
    if _cu is None:
        raise SystemExit("bench_register.py needs the CUDA driver library (libcuda.so.1)")
    _cu.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    _cu.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
    _cu.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    _cu.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]


def _check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"{what}: CUDA driver error {result}")


def load(files: list[Path], dest: torch.Tensor, window: int, helpers: int, ahead: int) -> dict:
    """Every file's bytes into `dest`, window by window; seconds and where the main thread waited."""
    ctx = ctypes.c_void_p()
    _check(_cu.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    stream = torch.cuda.Stream()
    handle = ctypes.c_void_p(stream.cuda_stream)
    fds = [os.open(f, os.O_RDONLY) for f in files]
    bases = []
    for fd, f in zip(fds, files):
        size = f.stat().st_size
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        bases.append((addr, size))
    windows = [(addr + at, min(window, size - at)) for addr, size in bases for at in range(0, size, window)]

    def register(w):
        if not hasattr(local, "set"):
            _check(_cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            local.set = True
        t = time.perf_counter()
        _check(_cu.cuMemHostRegister_v2(w[0], -(-w[1] // mmap.PAGESIZE) * mmap.PAGESIZE, _READ_ONLY), "cuMemHostRegister")
        return time.perf_counter() - t

    local = threading.local()
    waits = {"register_wait": 0.0, "copy_wait": 0.0, "register_s": 0.0, "unregister_s": 0.0}
    pool = ThreadPoolExecutor(helpers)
    torch.cuda.synchronize()
    start = time.perf_counter()
    queued = deque(pool.submit(register, w) for w in windows[:ahead])
    copying: deque = deque()
    pos = 0
    for i, w in enumerate(windows):
        t = time.perf_counter()
        waits["register_s"] += queued.popleft().result()
        waits["register_wait"] += time.perf_counter() - t
        if i + ahead < len(windows):
            queued.append(pool.submit(register, windows[i + ahead]))
        _check(_cu.cuMemcpyHtoDAsync_v2(dest.data_ptr() + pos, w[0], w[1], handle), "cuMemcpyHtoDAsync")
        pos += w[1]
        event = torch.cuda.Event()
        event.record(stream)
        copying.append((event, w))
        while len(copying) > 2 or (copying and copying[0][0].query()):
            event, done = copying.popleft()
            t = time.perf_counter()
            event.synchronize()
            waits["copy_wait"] += time.perf_counter() - t
            t = time.perf_counter()
            _cu.cuMemHostUnregister(done[0])
            _libc.munmap(done[0], done[1])
            waits["unregister_s"] += time.perf_counter() - t
    stream.synchronize()
    seconds = time.perf_counter() - start
    for event, done in copying:
        _cu.cuMemHostUnregister(done[0])
        _libc.munmap(done[0], done[1])
    pool.shutdown()
    for fd in fds:
        os.close(fd)
    return {"seconds": seconds, "gbps": pos / seconds / 1e9, **waits}


def _same(files: list[Path], dest: torch.Tensor) -> bool:
    """A few windows of `dest` against the files' bytes."""
    pos = 0
    for f in files:
        size = f.stat().st_size
        with open(f, "rb") as fh:
            data = os.pread(fh.fileno(), _MiB, size // 3)
        got = dest[pos + size // 3 : pos + size // 3 + _MiB].cpu().numpy().tobytes()
        if got != data:
            return False
        pos += size
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--window-mib", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--helpers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--ahead", type=int, default=8)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    _declare()
    print("| path | window MiB | helpers | GB/s | register_wait | copy_wait | register s (sum) | unregister s | same |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in args.paths:
        files = sorted(path.glob("*.safetensors"))
        dest = torch.empty(sum(f.stat().st_size for f in files), dtype=torch.uint8, device="cuda")
        for _ in range(args.reps):
            for w in args.window_mib:
                for h in args.helpers:
                    dest.zero_()
                    r = load(files, dest, w * _MiB, h, args.ahead)
                    print(f"| {path} | {w} | {h} | {r['gbps']:.1f} | {r['register_wait']:.3f} | {r['copy_wait']:.3f} | "
                          f"{r['register_s']:.3f} | {r['unregister_s']:.3f} | {_same(files, dest)} |", flush=True)
        del dest
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
