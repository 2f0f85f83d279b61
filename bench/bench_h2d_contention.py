"""Benchmark (not a test): the host-to-device copy rate by copy size, alone and while threads read files.

`stream`'s ring copies 16 MiB buffers while the page cache is read into the
next ones; its copies ran at about 49 GB/s against 55 for the ceiling's
256 MiB copies with nothing else running. This separates the two causes: the
copy size (the `alone` rows) and the reads beside the copies (`beside`
rows, the readers filling their own pinned or pageable buffers, looping over
the files until the copies end).

    python bench/bench_h2d_contention.py /tmp/pruned-r16 [/dev/shm/pruned-r16 ...]

Each copy row moves `--total` bytes into one device block; `read GB/s` is
what the readers got meanwhile.
"""
from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import torch

_MiB = 1024 * 1024


def copy_rate(dest: torch.Tensor, size: int, buffers: int) -> float:
    """GB/s of copying all of `dest` from `buffers` pinned host buffers of `size`, in order, on a side stream."""
    host = [torch.full((size,), 7, dtype=torch.uint8).pin_memory() for _ in range(buffers)]
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.cuda.stream(stream):
        for i, at in enumerate(range(0, dest.numel(), size)):
            n = min(size, dest.numel() - at)
            dest[at : at + n].copy_(host[i % buffers][:n], non_blocking=True)
    stream.synchronize()
    return dest.numel() / (time.perf_counter() - start) / 1e9


class Readers:
    """`threads` threads reading every file in `read_bytes` preadv calls, round and round, until stopped."""

    def __init__(self, files: list[Path], threads: int, read_bytes: int, pinned: bool):
        self._files, self._read_bytes, self._pinned = files, read_bytes, pinned
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._next = 0
        self._pieces = [(f, at) for f in files for at in range(0, f.stat().st_size, read_bytes)]
        self.bytes = 0
        self._threads = [threading.Thread(target=self._run) for _ in range(threads)]

    def _run(self) -> None:
        buf = torch.empty(self._read_bytes, dtype=torch.uint8, pin_memory=self._pinned)
        view = memoryview(buf.numpy())
        fds = {f: os.open(f, os.O_RDONLY) for f in self._files}
        got = 0
        try:
            while not self._stop.is_set():
                with self._lock:
                    file, at = self._pieces[self._next % len(self._pieces)]
                    self._next += 1
                got += os.preadv(fds[file], [view], at)
        finally:
            for fd in fds.values():
                os.close(fd)
            with self._lock:
                self.bytes += got

    def __enter__(self) -> "Readers":
        self.start = time.perf_counter()
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
        self.seconds = time.perf_counter() - self.start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="checkpoint folders whose shards the readers read")
    parser.add_argument("--total", type=int, default=16 * 1024, help="MiB copied per row")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--read-mib", type=int, default=4)
    args = parser.parse_args()
    dest = torch.empty(args.total * _MiB, dtype=torch.uint8, device="cuda")
    copy_rate(dest[: 256 * _MiB], 16 * _MiB, 2)  # CUDA's lazy set-up
    print("| copies | readers | copy GB/s | read GB/s |")
    print("|---|---|---|---|")
    for size, buffers in ((256, 4), (64, 4), (16, 8), (16, 32), (4, 32)):
        print(f"| {buffers} x {size} MiB | none | {copy_rate(dest, size * _MiB, buffers):.1f} | |", flush=True)
    for path in args.paths:
        files = sorted(path.glob("*.safetensors"))
        with Readers(files, args.threads, args.read_mib * _MiB, True) as r:
            time.sleep(1.0)
        print(f"| none | {args.threads} x {args.read_mib} MiB pinned, {path} | | {r.bytes / r.seconds / 1e9:.1f} |")
        for size, buffers, pinned in ((256, 4, True), (16, 8, True), (16, 8, False)):
            with Readers(files, args.threads, args.read_mib * _MiB, pinned) as r:
                rate = copy_rate(dest, size * _MiB, buffers)
            kind = "pinned" if pinned else "pageable"
            print(f"| {buffers} x {size} MiB | {args.threads} x {args.read_mib} MiB {kind}, {path} | {rate:.1f} | "
                  f"{r.bytes / r.seconds / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
