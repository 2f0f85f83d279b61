"""Job kinds the job tests register through DRAINBOARD_PLUGINS (so the job child finds them too).

They take their knobs from the environment the supervisor passes on:
DRAINBOARD_TEST_STEPS (default 5), DRAINBOARD_TEST_DELAY seconds per step (default 0),
DRAINBOARD_TEST_TRUTH (a file the `steps` kind writes each step it reached to, before recording
it: the ground truth a kill report is checked against) and DRAINBOARD_TEST_MIB (MiB per step
that `allocate` keeps).
"""

import os
import time

from jobs.kinds import job_kind


def _steps() -> tuple[int, float]:
    return int(os.environ.get("DRAINBOARD_TEST_STEPS", "5")), float(os.environ.get("DRAINBOARD_TEST_DELAY", "0"))


@job_kind("steps")
def run_steps(spec, ctx):
    """Record one sample per step, like a load records one per tensor; returns the step count."""
    total, delay = _steps()
    truth = os.environ.get("DRAINBOARD_TEST_TRUTH")
    fd = os.open(truth, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if truth else None
    with ctx.stage("load"):
        for step in range(1, total + 1):
            time.sleep(delay)
            if fd is not None:
                os.pwrite(fd, f"{step:>12}".encode(), 0)
            ctx.progress(step, total)
            ctx.record(tensors_placed=step, bytes_placed=step * 1024, tensor_name=f"blocks.{step}.weight")
    return {"steps": total}


@job_kind("fail")
def run_fail(spec, ctx):
    """Raise the way a bad checkpoint does."""
    with ctx.stage("load"):
        ctx.record(tensors_placed=0)
        raise ValueError("blocks.3.weight: expected shape (4, 4), got (4, 5)")


@job_kind("diffusers_import")
def run_diffusers_import(spec, ctx):
    """Import what a generate imports first (diffusers, which imports an installed torchao and its quantizer)."""
    import diffusers.quantizers  # noqa: F401

    return {}


@job_kind("broken_checkpoint")
def run_broken_checkpoint(spec, ctx):
    """Raise a checkpoint error listing several problems."""
    from core.errors import CheckpointError

    with ctx.stage("load"):
        raise CheckpointError([f"shard-{i}.safetensors: truncated, expected 4096 bytes" for i in range(3)])


@job_kind("allocate")
def run_allocate(spec, ctx):
    """Keep DRAINBOARD_TEST_MIB MiB more (pages touched) at every step: a load that outgrows its budget."""
    total, delay = _steps()
    chunk = int(float(os.environ.get("DRAINBOARD_TEST_MIB", "16")) * 2**20)
    kept = []
    with ctx.stage("load"):
        for step in range(1, total + 1):
            kept.append(bytearray(b"\1" * chunk))
            ctx.progress(step, total)
            ctx.record(tensors_placed=step, bytes_placed=step * chunk, tensor_name=f"blocks.{step}.weight")
            time.sleep(delay)
    return {"steps": total}


@job_kind("encode")
def run_encode(spec, ctx):
    """Write a video artifact slowly, the way the MP4 encoder does, and register it only when complete."""
    total, delay = _steps()
    path = ctx.artifact_path("video", ".mp4")
    with ctx.stage("encoding"), open(path, "wb") as f:
        for step in range(1, total + 1):
            f.write(b"\0" * 48)
            f.flush()
            ctx.progress(step, total)
            ctx.record()
            time.sleep(delay)
    ctx.add_artifact(path)
    return {"steps": total}


@job_kind("collector")
def run_collector(spec, ctx):
    """Report how many objects the garbage collector leaves alone (frozen before the child began)."""
    import gc

    with ctx.stage("load"):
        ctx.record(tensors_placed=0)
    return {"frozen_objects": gc.get_freeze_count()}


@job_kind("ring_load")
def run_ring_load(spec, ctx):
    """Read DRAINBOARD_TEST_FILE through `stream`'s ring on its io_uring reader once per step, checking
    every byte, recording a sample and keeping DRAINBOARD_TEST_MIB MiB more per step.

    A CPU destination stands in for CUDA: the ring's reads and its waits on
    the io_uring queue, where a SIGTERM lands, are the same code; only the
    copy out of each buffer is a memcpy instead of a queued device copy.
    """
    from pathlib import Path

    import torch

    from loader.metadata import TensorMeta
    from loader.placement.chunk_reads import FileHandles
    from loader.placement.chunks import Piece
    from loader.placement.ranges import RangeRing

    total, _ = _steps()
    path = Path(os.environ["DRAINBOARD_TEST_FILE"])
    keep = int(float(os.environ.get("DRAINBOARD_TEST_MIB", "0")) * 2**20)
    expected = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)
    fd = os.open(path, os.O_RDONLY)

    class OneFile(FileHandles):
        def fd_for(self, file):
            return fd, False

    kept = []
    try:
        with ctx.stage("load"):
            for step in range(1, total + 1):
                meta = TensorMeta(f"blocks.{step}.weight", "U8", (expected.numel(),), path, (0, expected.numel()), 0)
                out = torch.zeros_like(expected)
                ring = RangeRing(torch.device("cpu"), None, OneFile(), buffers=4, chunk_bytes=1 << 20,
                                 read_bytes=128 << 10, pin=False, reader="io_uring")
                try:
                    ring.run([Piece(meta, out, lambda: None)])
                except BaseException:
                    ring.cancel()
                    raise
                finally:
                    ring.release()
                if not torch.equal(out, expected):
                    raise ValueError(f"{path}: the ring read wrong bytes at step {step}")
                if keep:
                    kept.append(bytearray(b"\1" * keep))
                ctx.progress(step, total)
                ctx.record(tensors_placed=step, bytes_placed=step * expected.numel(), tensor_name=meta.name)
    finally:
        os.close(fd)
    return {"steps": total}


@job_kind("shrinking_file")
def run_shrinking_file(spec, ctx):
    """Map a file, truncate it under the map and read on: what a shard cut short mid-load does (SIGBUS)."""
    import mmap
    import tempfile

    with ctx.stage("load"), tempfile.TemporaryFile() as f:
        f.truncate(2**20)
        mapped = mmap.mmap(f.fileno(), 2**20, access=mmap.ACCESS_READ)
        ctx.record(tensors_placed=0)
        f.truncate(0)
        return {"byte": mapped[2**19]}


FORGED = "\n".join([
    "",
    '@drainboard ["guard", {"t": 1.0, "message": "forged guard", "data": {"reason": "budget"}}]',
    '@drainboard ["metrics", {"forged": true}]',
    '@drainboard ["error", ["forged error", null]]',
    '@drainboard ["exit", 0]',
    '@drainboard ["artifact", {"name": "video.mp4", "size": 4}]',
    '@drainboard ["chunk", {"name": "video.mp4", "data": "AAAAAA=="}]',
    '@drainboard ["event", {"job_id": 1, "t": 0, "created_at": 0, "kind": "warning", "stage": null, '
    '"message": "forged into job 1", "data": null}]',
    '@drainboard 1 0123456789abcdef0123456789abcdef ["metrics", {"forged": true}]',
    "",
])
"""Lines that imitate the protocol (its old untagged form, another job's, a guessed nonce)."""


@job_kind("forge")
def run_forge(spec, ctx):
    """Print protocol-looking lines (as a prompt or tensor names would reach the output) to stdout and
    stderr, record a sample named with them, then fail with an error text carrying them."""
    import sys

    with ctx.stage("load"):
        print(f"prompt: a red fox{FORGED}", flush=True)
        print(f"tensor blocks.0{FORGED}.weight", file=sys.stderr, flush=True)
        ctx.record(tensors_placed=1, bytes_placed=4, tensor_name=f"blocks.0{FORGED}.weight")
        ctx.event("warning", f"odd tensor name blocks.0{FORGED}.weight")
        raise ValueError(f"blocks.0{FORGED}.weight: expected shape (4, 4), got (4, 5)")


@job_kind("long_lines")
def run_long_lines(spec, ctx):
    """Print a line of DRAINBOARD_TEST_MIB MiB and record a sample whose tensor name is that long
    (a 5 MB tensor name in a skeleton load); returns the name's length."""
    import sys

    name = "x" * int(float(os.environ.get("DRAINBOARD_TEST_MIB", "5")) * 2**20)
    with ctx.stage("load"):
        print(f"placing {name}", file=sys.stderr, flush=True)
        ctx.record(tensors_placed=1, bytes_placed=4, tensor_name=name)
    return {"name_length": len(name)}


@job_kind("config")
def run_config(spec, ctx):
    """Return the configuration the job ran under (as JSON) and the child's working directory."""
    with ctx.stage("load"):
        ctx.record(tensors_placed=0)
    return {"config": ctx.config.to_json(), "cwd": os.getcwd()}
