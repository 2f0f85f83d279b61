"""Benchmark (not a test): how fast the ring's staging can be pinned, and how fast it copies once pinned.

A warm `stream` load waited 30-44 ms for its eight 16 MiB buffers to be
pinned on the H200 host, with the copy engine idle for most of it: a few
percent of a 0.86 s load. Each method runs in a fresh process (torch's
pinned allocator caches what it frees, so a second allocation in one
process costs nothing) and reports when the first buffer was ready, when all
were, and the host-to-device rate from them:

  torch_each     torch.empty(16 MiB, pin_memory=True) per buffer (what the ring does)
  torch_one      one torch.empty(128 MiB, pin_memory=True), cut into the buffers
  register       anonymous mmap, pages faulted in (MADV_POPULATE_WRITE), cuMemHostRegister per buffer
  register_thp   the same with MADV_HUGEPAGE first (2 MiB pages where the kernel allows them)
  torch_registerN  torch_each with torch's own `pinned_use_cuda_host_register` (malloc, then cudaHostRegister,
                 the pages faulted in by N threads; PYTORCH_CUDA_ALLOC_CONF in the child)

    python bench/bench_pinning.py [--buffers 8] [--mib 16] [--repeat 3]

`beside:METHOD` asks whether pinning on a helper thread holds up the loader's
own driver calls: while a helper pins the buffers by METHOD, the main thread
queues 1 MiB copies from a buffer pinned earlier, and the longest single
copy call, and the copies queued per millisecond during and after the
pinning, are reported.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

METHODS = ("torch_each", "torch_one", "register", "register_thp", "torch_register8", "torch_register16")
_MADV_HUGEPAGE = 14
_MADV_POPULATE_WRITE = 23
_MiB = 1 << 20


def _pinned_buffers(method: str, count: int, size: int) -> tuple[list, float, float]:
    """(buffers as (address, keep-alive), seconds to the first, seconds to all)."""
    import torch

    start = time.perf_counter()
    if method.startswith("torch"):
        if method == "torch_one":
            block = torch.empty(count * size, dtype=torch.uint8, pin_memory=True)
            first = time.perf_counter() - start
            return [(block.data_ptr() + i * size, block) for i in range(count)], first, time.perf_counter() - start
        buffers, first = [], 0.0
        for i in range(count):
            t = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            buffers.append((t.data_ptr(), t))
            first = first or time.perf_counter() - start
        return buffers, first, time.perf_counter() - start
    from loader.io.cuda_copy import _driver

    cu = _driver()
    cu.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    area = mmap.mmap(-1, count * size + 2 * _MiB)
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    base += -base % (2 * _MiB)
    buffers, first = [], 0.0
    for i in range(count):
        at = base + i * size
        if method == "register_thp":
            libc.madvise(at, size, _MADV_HUGEPAGE)
        if libc.madvise(at, size, _MADV_POPULATE_WRITE) != 0:
            ctypes.memset(at, 0, size)
        result = cu.cuMemHostRegister_v2(at, size, 0)
        if result != 0:
            raise SystemExit(f"cuMemHostRegister failed: CUDA driver error {result}")
        buffers.append((at, area))
        first = first or time.perf_counter() - start
    return buffers, first, time.perf_counter() - start


def run_child(method: str, count: int, size: int) -> dict:
    import torch

    from loader.io.cuda_copy import DriverCopier

    torch.empty(0, device="cuda")
    buffers, first, whole = _pinned_buffers(method, count, size)
    dest = torch.empty(count * size, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.device(0):
        copier = DriverCopier.for_device(torch.device("cuda", 0), stream)
    rounds = 16
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(rounds):
        for i, (address, _) in enumerate(buffers):
            copier.copy(dest.data_ptr() + i * size, address, size)
    stream.synchronize()
    copy = time.perf_counter() - t
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return {"method": method, "first_ms": first * 1e3, "all_ms": whole * 1e3,
            "copy_gbps": rounds * count * size / copy / 1e9,
            "thp": thp.read_text().strip() if thp.exists() else "absent"}


def run_beside(method: str, count: int, size: int) -> dict:
    import threading

    import torch

    from loader.io.cuda_copy import DriverCopier

    torch.empty(0, device="cuda")
    source = torch.empty(_MiB, dtype=torch.uint8, pin_memory=True)
    dest = torch.empty(_MiB, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.device(0):
        copier = DriverCopier.for_device(torch.device("cuda", 0), stream)
    torch.cuda.synchronize()
    failed: list[BaseException] = []

    def pin() -> None:
        torch.cuda.synchronize()  # makes the device's context current on this thread, for cuMemHostRegister
        try:
            _pinned_buffers(method, count, size)
        except BaseException as exc:  # noqa: BLE001  (SystemExit too: re-raised below, on the main thread)
            failed.append(exc)

    helper = threading.Thread(target=pin)

    def queue(until) -> tuple[int, float, float]:
        calls, longest, t0 = 0, 0.0, time.perf_counter()
        while until():
            t = time.perf_counter()
            copier.copy(dest.data_ptr(), source.data_ptr(), _MiB)
            longest = max(longest, time.perf_counter() - t)
            calls += 1
            if calls % 64 == 0:
                stream.synchronize()
        return calls, longest, time.perf_counter() - t0

    helper.start()
    during, longest_during, during_s = queue(helper.is_alive)
    end = time.perf_counter() + during_s
    after, longest_after, after_s = queue(lambda: time.perf_counter() < end)
    stream.synchronize()
    if failed:
        raise failed[0]
    return {"method": f"beside:{method}", "pinning_ms": during_s * 1e3, "longest_call_ms": longest_during * 1e3,
            "per_ms_during": during / during_s / 1e3, "per_ms_after": after / after_s / 1e3,
            "longest_after_ms": longest_after * 1e3}


def _child_env(method: str) -> dict:
    """The child's environment: torch's host-register settings for a torch_registerN method."""
    env = dict(os.environ)
    threads = method.removeprefix("beside:").removeprefix("torch_register")
    if threads.isdigit():
        env["PYTORCH_CUDA_ALLOC_CONF"] = f"pinned_use_cuda_host_register:True,pinned_num_register_threads:{threads}"
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--buffers", type=int, default=8)
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--methods", nargs="+", help="a subset of the methods (and beside:METHOD rows) to run")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        method = args.child.removeprefix("beside:")
        run = run_beside if args.child.startswith("beside:") else run_child
        print(json.dumps(run(method, args.buffers, args.mib * _MiB)))
        return
    rows: dict[str, list[dict]] = {m: [] for m in (*METHODS, "beside:torch_each", "beside:register")
                                   if not args.methods or m in args.methods}
    for _ in range(args.repeat):
        for method in rows:
            out = subprocess.run([sys.executable, __file__, "--child", method, "--buffers", str(args.buffers),
                                  "--mib", str(args.mib)], capture_output=True, text=True, env=_child_env(method))
            if out.returncode:
                print(f"{method}: failed: {out.stderr.strip()[-300:]}", file=sys.stderr)
                continue
            rows[method].append(json.loads(out.stdout))
    print(f"{args.buffers} x {args.mib} MiB, medians of {args.repeat} fresh processes; THP: "
          f"{next((r[0]['thp'] for r in rows.values() if r and 'thp' in r[0]), '?')}")
    print("| method | first buffer ms | all buffers ms | copy GB/s |")
    print("|---|---|---|---|")
    for method in METHODS:
        if rows.get(method):
            med = {k: statistics.median(x[k] for x in rows[method]) for k in ("first_ms", "all_ms", "copy_gbps")}
            print(f"| {method} | {med['first_ms']:.1f} | {med['all_ms']:.1f} | {med['copy_gbps']:.1f} |")
    keys = ("pinning_ms", "longest_call_ms", "per_ms_during", "per_ms_after", "longest_after_ms")
    print("\n1 MiB copies queued by the main thread while a helper pins, medians:")
    print("| helper | pinning ms | longest copy call ms | copies per ms during | after | longest call after ms |")
    print("|---|---|---|---|---|---|")
    for method in ("beside:torch_each", "beside:register"):
        if rows.get(method):
            med = {k: statistics.median(x[k] for x in rows[method]) for k in keys}
            print(f"| {method.removeprefix('beside:')} | " + " | ".join(f"{med[k]:.2f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
