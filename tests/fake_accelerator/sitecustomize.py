"""Imported at start-up by every Python process whose PYTHONPATH holds this folder (the ranks a test starts).

diffusers 0.42.1's `enable_parallelism` places rank r on `rank % torch.accelerator.device_count()` of the
accelerator's type; on a CPU-only torch that count is 0 and the call divides by zero before any collective. This
reports one device, so the type stays `cpu` and each rank lands on `cpu:0`: the one change that lets the CPU tests
run diffusers' context parallelism over gloo. Nothing else of torch or diffusers is touched.
"""

import torch

torch.accelerator.device_count = lambda: 1
