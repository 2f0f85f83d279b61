"""Benchmark (not a test): one InstantTensor backend loading a checkpoint to the GPU, in this fresh process.

bench_peers.py's instanttensor_buffered asks for BackendPolicy.BUFFERED, which picks URING_BUFFERED;
this names the backend outright, to learn which of InstantTensor's own backends is its fastest:

    for b in URING_BUFFERED MMAP AIO_BUFFERED; do
      INSTANTTENSOR_DEBUG=1 python bench/bench_instanttensor_backends.py /tmp/pruned-r16 $b; done
"""
import os, sys, time, json
import torch
import instanttensor
from instanttensor import safe_open
from pathlib import Path
files = [str(f) for f in sorted(Path(sys.argv[1]).glob("*.safetensors"))]
name = sys.argv[2]
backend = getattr(instanttensor.Backend, name)
torch.empty(0, device="cuda")
t = time.perf_counter()
with safe_open(files, framework="pt", device=0, backend=backend) as f:
    d = dict(f.tensors())
torch.cuda.synchronize()
dt = time.perf_counter() - t
n = sum(x.numel() * x.element_size() for x in d.values())
print(json.dumps({"it_backend": name, "seconds": round(dt, 3), "gbps": round(n / dt / 1e9, 2)}), flush=True)
