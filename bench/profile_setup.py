"""Profile (not a test): what a fresh process pays around `stream`'s own load, step by step.

The peer bench times a case from its first call (imports included) to the
last tensor on the device; the load's report times only from the first read.
This runs the same steps as `load_checkpoint`, one at a time, in a fresh
process after the same preparation as the bench's children (CUDA initialised,
torch's import-time objects frozen), and prints each step's milliseconds.
Inside the fill, the first call of each set-up step up to the ring's first
copy is timed too (start and end, from the fill's start): the copy engine
idles until that copy.

    python bench/profile_setup.py /tmp/pruned-r16 [--device cuda]
"""
from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    path = sys.argv[1]
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    import torch

    if device.startswith("cuda"):
        torch.empty(0, device=device)
    gc.collect()
    gc.freeze()
    marks = [("start", time.perf_counter())]

    def mark(name: str) -> None:
        marks.append((name, time.perf_counter()))

    from loader import api
    from loader.checkpoint import discover_checkpoint
    from loader.dtypes import DtypePolicy
    from loader.naming import plan_targets
    from loader.placement import LoadPlan, PlannedTarget, get_placement
    from loader.report import LoadReport
    from loader.skeleton import build_skeleton

    mark("import the loader")
    placement = get_placement("stream")
    target = api.resolve_device(device)
    comp = discover_checkpoint(path).component(None)
    mark("discover (headers, index, validation)")
    targets, skipped = plan_targets(comp.tensors, None, None)
    policy = DtypePolicy.build(None, None, ())
    planned = [PlannedTarget(t, policy.target_dtype(t.name, t.sources[0].torch_dtype)) for t in targets]
    mark("plan names and dtypes")
    module = build_skeleton((p.name, p.target.shape, p.dtype) for p in planned)
    mark("skeleton")
    plan = LoadPlan(targets=planned, dropped=list(skipped))  # as load_checkpoint does for its own skeleton
    report = LoadReport(mode=placement.name, device=str(target), tensors_total=len(plan.targets))
    mark("plan and report")
    firsts = _time_first_calls()
    allocations = _time_allocations(8)
    copies, pinned = _time_ramp()
    fill_start = time.perf_counter()
    api._fill(placement, plan, module, target, report, None, None)
    mark("fill (the load itself, its baseline and last samples)")
    tensors = dict(module.state_dict())
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    mark("state dict, synchronise")
    total = marks[-1][1] - marks[0][1]
    for (_, a), (name, b) in zip(marks, marks[1:]):
        print(f"{name:55} {1e3 * (b - a):8.1f} ms")
    print(f"{'of which the report timed (load_seconds)':55} {1e3 * report.load_seconds:8.1f} ms")
    print(f"{'total':55} {1e3 * total:8.1f} ms")
    print(f"{'outside the report clock':55} {1e3 * (total - report.load_seconds):8.1f} ms  ({len(tensors)} tensors)")
    print("first calls inside the fill (ms from its start: start - end):")
    for name, (a, b) in sorted(firsts.items(), key=lambda kv: kv[1][0]):
        print(f"  {name:53} {1e3 * (a - fill_start):8.1f} - {1e3 * (b - fill_start):6.1f}")
    print("the ramp: ring buffers ready (helper's pinning, ms from the fill's start):",
          " ".join(f"{1e3 * (t - fill_start):.1f}" for t in pinned))
    marks_ms = (10, 20, 30, 40, 60, 80, 100, 150, 200)
    issued = [sum(n for t, n in copies if t - fill_start <= ms / 1e3) for ms in marks_ms]
    print("  copies queued by (ms: GB):", "  ".join(f"{ms}: {b / 1e9:.2f}" for ms, b in zip(marks_ms, issued)))
    print(f"the first {len(allocations)} destinations (ms from the fill's start: start - end, bytes):")
    for a, b, nbytes in allocations:
        print(f"  {'':53} {1e3 * (a - fill_start):8.1f} - {1e3 * (b - fill_start):6.1f}  {nbytes:>12,}")


def _time_allocations(count: int) -> list[tuple[float, float, int]]:
    """Wrap `PlacementContext.allocate` so its first `count` calls record (start, end, bytes): the first
    destinations are allocated on the loader's thread while the helpers pin and reserve beside it."""
    from loader.placement import base

    plain = base.PlacementContext.allocate
    calls: list[tuple[float, float, int]] = []

    def wrapper(self, planned):
        t = time.perf_counter()
        try:
            return plain(self, planned)
        finally:
            if len(calls) < count:
                calls.append((t, time.perf_counter(), planned.nbytes))

    base.PlacementContext.allocate = wrapper
    return calls


def _time_ramp() -> tuple[list[tuple[float, int]], list[float]]:
    """Record every driver copy the ring queues (when, bytes) and when each ring buffer's pinning ended:
    a fresh process's ring runs on the buffers pinned so far."""
    from loader import cuda_copy
    from loader.placement import ranges

    copies: list[tuple[float, int]] = []
    pinned: list[float] = []
    plain_copy, plain_allocate = cuda_copy.DriverCopier.copy, ranges.RangeRing._allocate

    def copy(self, dst, src, nbytes):
        copies.append((time.perf_counter(), nbytes))
        return plain_copy(self, dst, src, nbytes)

    def allocate(self, *args):
        try:
            return plain_allocate(self, *args)
        finally:
            pinned.append(time.perf_counter())

    cuda_copy.DriverCopier.copy, ranges.RangeRing._allocate = copy, allocate
    return copies, pinned


def _time_first_calls() -> dict[str, tuple[float, float]]:
    """Wrap the fill's set-up steps so the first call of each records its (start, end) perf_counter."""
    import torch

    from loader import cuda_copy, report, uring
    from loader.placement import base, ranges, stream

    firsts: dict[str, tuple[float, float]] = {}

    def timed(owner, attr: str) -> None:
        plain = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return plain(*args, **kwargs)
            finally:
                firsts.setdefault(f"{getattr(owner, '__name__', owner)}.{attr}", (t, time.perf_counter()))

        setattr(owner, attr, wrapper)

    for attr in ("baseline", "start", "placed"):
        timed(report.LoadMeter, attr)
    timed(cuda_copy.DriverCopier, "copy")
    timed(uring.ReadQueue, "complete")
    timed(base.PlacementContext, "reserve")
    timed(torch.cuda, "Stream")
    timed(torch.cuda, "Event")
    for attr in ("probe_device", "sampled_residency", "OpenFiles", "ring_geometry", "RangeRing", "Staging", "_mem_available"):
        timed(stream, attr)
    for attr in ("open", "start_pinning", "_open_reader", "_open_copiers", "_take_free", "_buffer", "_submit", "_retire"):
        timed(ranges.RangeRing, attr)
    return firsts


if __name__ == "__main__":
    main()
