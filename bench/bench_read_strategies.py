"""Benchmark (not a test): which way of reading the page cache can feed an H200's copy engine?

Reads every shard of a checkpoint (warm) into pinned or transparent-huge-page
buffers with: Python threads calling preadv, C threads calling pread, C
threads copying from an mmap, and one io_uring (inline, or on the kernel's
workers with IOSQE_ASYNC, plain or fixed buffers); then some of them while
the main thread runs host-to-device copies; then what stream's main thread
pays for 639 CUDA allocations and 639 memory samples. The C side
(`bench/read_strategies.c`) is built with gcc on the spot.

    python bench/bench_peers.py --make-checkpoint /tmp/pruned-r16
    python bench/bench_read_strategies.py /tmp/pruned-r16      # on the GPU host; writes $OUT/explore.json
"""
import ctypes, json, os, subprocess, sys, threading, time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import torch

HERE = Path(__file__).resolve().parent
CKPT = Path(sys.argv[1])
OUT = Path(os.environ.get("OUT", "/tmp"))
subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-pthread", "-o", "/tmp/rd.so", str(HERE / "read_strategies.c")], check=True)
lib = ctypes.CDLL("/tmp/rd.so")
files = sorted(CKPT.glob("*.safetensors"))
sizes = [f.stat().st_size for f in files]
TOTAL = sum(sizes)
fds = [os.open(f, os.O_RDONLY) for f in files]
FD = (ctypes.c_int * len(fds))(*fds)
SZ = (ctypes.c_long * len(sizes))(*sizes)
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
cudart = torch.cuda.cudart()
torch.cuda.init()
results = []


def log(**row):
    results.append(row)
    print(json.dumps(row), flush=True)


def pinned(n, size):
    ts = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(n)]
    return ts, [t.data_ptr() for t in ts]


def thp(n, size, register):
    ptrs = []
    for _ in range(n):
        p = libc.mmap(None, size, 3, 0x22, -1, 0)
        libc.madvise(p, size, 14)  # MADV_HUGEPAGE
        ctypes.memset(p, 1, size)
        if register:
            r = cudart.cudaHostRegister(p, size, 0)
            assert int(r) == 0, r
        ptrs.append(p)
    return ptrs


def arr(ptrs):
    return (ctypes.c_void_p * len(ptrs))(*ptrs)


def timed(label, fn, **extra):
    t = time.perf_counter()
    rc = fn()
    dt = time.perf_counter() - t
    log(case=label, rc=rc, seconds=round(dt, 4), gbps=round(TOTAL / dt / 1e9, 2), **extra)


def c_threads(ptrs, threads, chunk, mode):
    return lambda: lib.read_threads(len(fds), FD, SZ, threads, ctypes.c_long(chunk), arr(ptrs), mode)


def c_uring(ptrs, depth, chunk, flags):
    return lambda: lib.read_uring(len(fds), FD, SZ, depth, ctypes.c_long(chunk), arr(ptrs), flags)


def py_threads(bufs, threads, chunk):
    def run():
        jobs = [(i, off) for i, s in enumerate(sizes) for off in range(0, s, chunk)]
        it = iter(jobs)
        lock = threading.Lock()

        def work(t):
            view = memoryview(bufs[t].numpy())
            while True:
                with lock:
                    j = next(it, None)
                if j is None:
                    return
                i, off = j
                n = min(chunk, sizes[i] - off)
                os.preadv(fds[i], [view[:n]], off)

        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(work, range(threads)))
        return 0
    return run


MiB = 1 << 20
print(open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip(), flush=True)
# read strategies into cudaHostAlloc'd pinned buffers
P32 = pinned(32, 32 * MiB)
timed("py_preadv_pinned t16 32M", py_threads(P32[0], 16, 32 * MiB))
timed("c_pread_pinned t16 32M", c_threads(P32[1][:16], 16, 32 * MiB, 0))
timed("c_pread_pinned t32 32M", c_threads(P32[1], 32, 32 * MiB, 0))
timed("c_pread_pinned t16 8M", c_threads(P32[1][:16], 16, 8 * MiB, 0))
timed("c_mmapcpy_pinned t16 8M", c_threads(P32[1][:16], 16, 8 * MiB, 1))
timed("uring_pinned d16 8M async", c_uring(P32[1][:16], 16, 8 * MiB, 1))
timed("uring_pinned d32 8M async", c_uring(P32[1], 32, 8 * MiB, 1))
timed("uring_pinned d16 32M async", c_uring(P32[1][:16], 16, 32 * MiB, 1))
timed("uring_pinned d16 8M fixed async", c_uring(P32[1][:16], 16, 8 * MiB, 3))
timed("uring_pinned d16 8M inline", c_uring(P32[1][:16], 16, 8 * MiB, 0))
timed("uring_pinned d32 8M fixed async", c_uring(P32[1], 32, 8 * MiB, 3))
# THP buffers
t = time.perf_counter()
T = thp(32, 32 * MiB, register=True)
log(case="thp alloc+touch+register 32x32M", seconds=round(time.perf_counter() - t, 4))
timed("c_pread_thp t16 32M", c_threads(T[:16], 16, 32 * MiB, 0))
timed("c_pread_thp t16 8M", c_threads(T[:16], 16, 8 * MiB, 0))
timed("uring_thp d16 8M async", c_uring(T[:16], 16, 8 * MiB, 1))
timed("uring_thp d16 8M fixed async", c_uring(T[:16], 16, 8 * MiB, 3))
timed("c_mmapcpy_thp t16 8M", c_threads(T[:16], 16, 8 * MiB, 1))
log(case="AnonHugePages", kb=[l for l in open("/proc/meminfo") if l.startswith("AnonHugePages")][0].split()[1])
t = time.perf_counter()
for _ in range(3):
    P = pinned(18, 32 * MiB)
    del P
log(case="cudaHostAlloc 18x32M (x3, fresh each? cached by torch)", seconds=round(time.perf_counter() - t, 4))

# concurrency: reads (C, GIL released) while the main thread runs H2D copies from another pinned buffer
dev = torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
src = torch.empty(256 * MiB, dtype=torch.uint8, pin_memory=True)
s = torch.cuda.Stream()
for label, fn in [("uring_pinned d16 8M fixed async", c_uring(P32[1][:16], 16, 8 * MiB, 3)),
                  ("c_pread_pinned t16 8M", c_threads(P32[1][:16], 16, 8 * MiB, 0)),
                  ("uring_thp d16 8M fixed async", c_uring(T[:16], 16, 8 * MiB, 3))]:
    box = {}
    th = threading.Thread(target=lambda: box.update(t0=time.perf_counter(), rc=fn(), t1=time.perf_counter()))
    copied = 0
    th.start()
    t0 = time.perf_counter()
    with torch.cuda.stream(s):
        while th.is_alive():
            for k in range(4):
                dev[k * 256 * MiB:(k + 1) * 256 * MiB].copy_(src, non_blocking=True)
            s.synchronize()
            copied += 1024 * MiB
    t1 = time.perf_counter()
    th.join()
    log(case="concurrent " + label, read_gbps=round(TOTAL / (box["t1"] - box["t0"]) / 1e9, 2),
        h2d_gbps=round(copied / (t1 - t0) / 1e9, 2), rc=box["rc"])

# allocation and sampling costs of stream's main thread
spec = json.loads((HERE / "specs" / "h3_pruned_r16_transformer.json").read_text())
del dev
torch.cuda.synchronize()
t = time.perf_counter()
ts = [torch.empty(shape, dtype=torch.bfloat16, device="cuda") for _, shape in spec["tensors"]]
torch.cuda.synchronize()
log(case="639 cuda allocations", seconds=round(time.perf_counter() - t, 4))
sys.path.insert(0, str(HERE.parent))
from machine.memory import MemoryProbe
p = MemoryProbe("cuda")
t = time.perf_counter()
for _ in range(639):
    p.sample()
log(case="639 memory samples", seconds=round(time.perf_counter() - t, 4))
(OUT / "explore.json").write_text(json.dumps(results, indent=1))
