"""What recording a memory sample per tensor costs a load, and how fast samples are ingested.

    python bench/bench_sampling.py [--tensors 600] [--tensor-mib 1] [--device cpu] [--json]

Writes a synthetic one-shard checkpoint to a temporary folder, loads it once
(warm-up, discarded), then alternately with a job context recording a sample
and a progress update per tensor (what a `load` job does) and without,
`--repeats` times each, and compares the median `load_seconds` (alternating
keeps a noisy neighbour from landing on one side only). Then times
`SampleWriter.add` for 200,000 samples.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from jobs.context import JobContext  # noqa: E402
from machine import MemoryProbe
from loader import LoadOptions, load_checkpoint  # noqa: E402
from storage import jobs_table  # noqa: E402
from storage.schema import open_database  # noqa: E402
from storage.queries import sample_count  # noqa: E402
from storage.sample_writer import SampleWriter  # noqa: E402


def write_checkpoint(folder: Path, tensors: int, tensor_mib: float) -> Path:
    side = int((tensor_mib * 2**20 / 4) ** 0.5)
    generator = torch.Generator().manual_seed(0)
    state = {f"blocks.{i}.weight": torch.randn(side, side, generator=generator) for i in range(tensors)}
    path = folder / "model.safetensors"
    save_file(state, str(path))
    return path


def new_job(db_path: Path) -> int:
    db = open_database(db_path)
    job_id = jobs_table.enqueue(db, "load", {})
    jobs_table.claim_oldest(db, "bench")
    db.conn.close()
    return job_id


def timed_load(checkpoint: Path, device: str, ctx: JobContext | None) -> float:
    probe = ctx.probe if ctx else MemoryProbe(device)

    def on_tensor(placed) -> None:
        ctx.progress(placed.index, placed.total)
        ctx.record(placed.sample, tensors_placed=placed.index, bytes_placed=placed.bytes_placed,
                   tensor_name=placed.name)

    _, report = load_checkpoint(
        checkpoint,
        LoadOptions(device=device),
        on_tensor=on_tensor if ctx else None, probe=probe,
    )
    if ctx:
        ctx.samples.flush()
    return report.load_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=600)
    parser.add_argument("--tensor-mib", type=float, default=1.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3, help="loads of each kind, alternating")
    parser.add_argument("--ingest", type=int, default=200_000, help="samples for the ingest-rate test")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        checkpoint = write_checkpoint(folder, args.tensors, args.tensor_mib)
        db_path = folder / "drainboard.db"
        timed_load(checkpoint, args.device, None)  # warm the page cache and the allocator
        without, with_sampling = [], []
        job_id = new_job(db_path)
        ctx = JobContext(job_id, db_path=db_path, data_dir=folder, probe=MemoryProbe(args.device))
        for _ in range(args.repeats):
            without.append(timed_load(checkpoint, args.device, None))
            with_sampling.append(timed_load(checkpoint, args.device, ctx))
        # The same per-tensor work in isolation: steadier than a difference of two loads on a busy host.
        sample = ctx.probe.sample()
        start = time.perf_counter()
        for i in range(1, args.tensors + 1):
            ctx.progress(i, args.tensors)
            ctx.record(sample, tensors_placed=i, bytes_placed=i, tensor_name="blocks.0.weight")
        ctx.samples.flush()
        record_us = (time.perf_counter() - start) / args.tensors * 1e6
        ctx.close()
        recorded = sample_count(open_database(db_path), job_id)

        ingest_job = new_job(db_path)
        writer = SampleWriter(db_path, ingest_job, t0=0.0)
        probe = MemoryProbe()
        sample = probe.sample()
        start = time.perf_counter()
        for i in range(args.ingest):
            writer.add(sample, stage="load", tensors_placed=i, bytes_placed=i, tensor_name="blocks.0.weight")
        writer.close()
        ingest_seconds = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(10_000):
            probe.sample()
        probe_us = (time.perf_counter() - start) / 10_000 * 1e6

    result = {
        "device": args.device,
        "tensors": args.tensors,
        "checkpoint_mib": round(args.tensors * args.tensor_mib, 1),
        "load_seconds_without_sampling": round(statistics.median(without), 4),
        "load_seconds_with_sampling": round(statistics.median(with_sampling), 4),
        "sampling_overhead_pct": round((statistics.median(with_sampling) / statistics.median(without) - 1) * 100, 2),
        "repeats": args.repeats,
        "recording_us_per_tensor": round(record_us, 2),
        "accounted_overhead_pct": round(record_us * args.tensors / 1e6 / statistics.median(without) * 100, 3),
        "samples_recorded": recorded - args.tensors,
        "ingest_samples_per_s": round(args.ingest / ingest_seconds),
        "ingest_us_per_sample": round(ingest_seconds / args.ingest * 1e6, 2),
        "probe_read_us": round(probe_us, 2),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
