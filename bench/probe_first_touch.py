"""Probe (not a test): what a fresh process pays to allocate device memory and first copy into it.

    python bench/probe_first_touch.py 40      # GiB; run it twice in a row: the second process gets memory the first freed
"""
import sys
import time

import torch

torch.empty(0, device="cuda")
torch.cuda.synchronize()
n = int(float(sys.argv[1]) * 2**30)
clock = time.perf_counter
t0 = clock()
block = torch.empty(n, dtype=torch.uint8, device="cuda")
t1 = clock()
host = torch.empty(16 << 20, dtype=torch.uint8, pin_memory=True)
stream = torch.cuda.Stream()
t2 = clock()
with torch.cuda.stream(stream):
    block[: 16 << 20].copy_(host, non_blocking=True)
t3 = clock()
stream.synchronize()
t4 = clock()
with torch.cuda.stream(stream):
    block[-(16 << 20):].copy_(host, non_blocking=True)
stream.synchronize()
t5 = clock()
torch.cuda.synchronize()
t6 = clock()
print(f"{sys.argv[1]} GiB: malloc {1e3 * (t1 - t0):.1f} ms, pin 16 MiB {1e3 * (t2 - t1):.1f}, first copy issued {1e3 * (t3 - t2):.1f}"
      f" and done {1e3 * (t4 - t3):.1f}, copy at the end {1e3 * (t5 - t4):.1f}, device sync {1e3 * (t6 - t5):.1f}")
