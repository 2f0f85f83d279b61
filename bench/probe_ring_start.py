"""Probe (not a test): what the CUDA ring's first buffer costs in a fresh process, step by step.

The copy engine idles until the ring's first copy; before it come a copy
stream, the first host buffer (mapped, faulted in, registered with the
driver) and its first read. This times each of those alone, in the order the
ring meets them, after the same preparation as the peer bench's children:

    python bench/probe_ring_start.py /tmp/pruned-r16 [--stream torch|driver]

`--stream driver` makes the copy stream with `cuStreamCreate` and wraps it
for torch (`torch.cuda.ExternalStream`) instead of taking one from torch's
stream pool, whose first use creates the whole pool. Last, it times ways to
fault in fresh memory (madvise, MAP_POPULATE, huge pages, two threads).
"""
from __future__ import annotations

import ctypes
import gc
import mmap
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_MiB = 1 << 20


def main() -> None:
    path = Path(sys.argv[1])
    kind = sys.argv[sys.argv.index("--stream") + 1] if "--stream" in sys.argv else "torch"
    import torch

    torch.empty(0, device="cuda")
    gc.collect()
    gc.freeze()
    from loader.io.cuda_copy import _driver
    from loader.io.pinned import current_context
    from loader.io.reading import byte_view, populate
    from loader.io.uring import ReadQueue

    lib = _driver()
    clock = time.perf_counter

    def ms(t: float) -> str:
        return f"{1e3 * (clock() - t):7.2f} ms"

    t = clock()
    if kind == "driver":
        handle = ctypes.c_void_p()
        lib.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        assert lib.cuStreamCreate(ctypes.byref(handle), 1) == 0
        stream = torch.cuda.ExternalStream(handle.value)
    else:
        stream = torch.cuda.Stream()
    print(f"copy stream ({kind}) {ms(t)}")
    t = clock()
    stream.wait_stream(torch.cuda.current_stream())
    event = torch.cuda.Event()
    event.record(stream)
    print(f"wait on the current stream, record an event {ms(t)}")

    context = current_context()
    size = 16 * _MiB

    def buffer(label: str, register: bool = True) -> torch.Tensor:
        t = clock()
        area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf = torch.frombuffer(area, dtype=torch.uint8)
        mapped = clock()
        done = populate(byte_view(buf))
        populated = clock()
        if register:
            lib.cuCtxSetCurrent(context)
            assert lib.cuMemHostRegister_v2(buf.data_ptr(), size, 1) == 0
        print(f"{label}: map {1e3 * (mapped - t):6.2f}, populate ({'madvise' if done else 'refused'}) "
              f"{1e3 * (populated - mapped):6.2f}, register {1e3 * (clock() - populated):6.2f} ms")
        return buf

    first = buffer("buffer 1")
    buffer("buffer 2")
    file = sorted(path.glob("*.safetensors"))[0]
    fd = os.open(file, os.O_RDONLY)
    t = clock()
    queue = ReadQueue.open(64)
    queue.limit_workers(16)
    print(f"io_uring open, workers capped {ms(t)}")

    def read_chunk(at: int, into: torch.Tensor, label: str) -> None:
        t = clock()
        ids = [queue.submit(fd, at + a, into.data_ptr() + a, 4 * _MiB) for a in range(0, size, 4 * _MiB)]
        queue.flush()
        queue.complete(ids)
        for i in ids:
            queue.wait(i)
        print(f"{label} {ms(t)}")

    for i in range(3):
        read_chunk(i * size, first, f"read 16 MiB in 4 parts, chunk {i + 1}")
    # A buffer faulted in but not yet registered is read into while the helper registers it.
    late = buffer("buffer 3 (faulted in, registered beside its read)", register=False)
    t = clock()
    registering = threading.Thread(target=lambda: (lib.cuCtxSetCurrent(context), lib.cuMemHostRegister_v2(late.data_ptr(), size, 1)))
    registering.start()
    read_chunk(3 * size, late, "  its read, beside the registration")
    registering.join()
    print(f"  read and registration together {ms(t)}")
    # A fresh mapping, not faulted in: its read faults the pages in, then it is registered.
    t = clock()
    area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    fresh = torch.frombuffer(area, dtype=torch.uint8)
    read_chunk(4 * size, fresh, "buffer 4, not faulted in: its read")
    r = clock()
    lib.cuCtxSetCurrent(context)
    assert lib.cuMemHostRegister_v2(fresh.data_ptr(), size, 1) == 0
    print(f"  then its registration {ms(r)}; map, read and register {ms(t)}")
    os.close(fd)
    queue.close()
    _fault_in_variants()


def _fault_in_variants() -> None:
    """Ways to fault in fresh anonymous memory, each on a fresh mapping (faulting in is most of pinning)."""
    from loader.io.reading import populate

    libc = ctypes.CDLL(None, use_errno=True)
    madv_hugepage = 14

    def madvise_populate(size: int, huge: bool = False) -> None:
        area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        view = memoryview(area)
        if huge:
            address = ctypes.addressof(ctypes.c_char.from_buffer(view))
            libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(size), madv_hugepage)
        assert populate(view)
        view.release()

    def map_populate(size: int) -> None:
        mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE).close()

    def two_threads(size: int) -> None:
        threads = [threading.Thread(target=madvise_populate, args=(size,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    for label, run, size in [
        ("MADV_POPULATE_WRITE, 16 MiB", madvise_populate, 16 * _MiB),
        ("MAP_POPULATE, 16 MiB", map_populate, 16 * _MiB),
        ("MADV_HUGEPAGE then MADV_POPULATE_WRITE, 16 MiB", lambda n: madvise_populate(n, True), 16 * _MiB),
        ("two threads, 16 MiB each", two_threads, 16 * _MiB),
        ("MADV_POPULATE_WRITE, 128 MiB at once", madvise_populate, 128 * _MiB),
        ("MAP_POPULATE, 128 MiB at once", map_populate, 128 * _MiB),
        ("MADV_POPULATE_WRITE, 16 MiB", madvise_populate, 16 * _MiB),
        ("MAP_POPULATE, 16 MiB", map_populate, 16 * _MiB),
    ]:
        t = time.perf_counter()
        run(size)
        print(f"fault in: {label:48} {1e3 * (time.perf_counter() - t):7.2f} ms")


if __name__ == "__main__":
    main()
