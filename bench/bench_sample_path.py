"""What the path of a memory sample costs: the child's side (pipe vs database) and the fsync per batch.

    python bench/bench_sample_path.py [--samples 20000] [--batches 300] [--json]

1. Per sample in the job child: `PipeSink.add` (one JSON line written to the
   supervisor's pipe; a `SampleRelay` in another process stores it, as under a
   supervisor) against `DatabaseSink.add` (buffered, a batch written every 256
   samples), timed alternately, `--samples` each, three rounds.
2. Per batch on the database side: a `SampleWriter` commit of 64 samples with
   `synchronous = NORMAL` against `FULL` (an fsync of the WAL at every commit,
   what makes samples survive a frozen host), `--batches` each, alternating.
The database lives in a temporary folder on the disk under the current folder
(`/tmp` may be a tmpfs, where an fsync costs nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobs.samples import DatabaseSink, PipeSink, SampleRelay, open_sample_pipe  # noqa: E402
from machine.memory import MemoryProbe  # noqa: E402
from storage import jobs_table  # noqa: E402
from storage.schema import open_database  # noqa: E402
from storage.sample_writer import SampleWriter  # noqa: E402


def new_job(db_path: Path) -> int:
    db = open_database(db_path)
    job_id = jobs_table.enqueue(db, "load", {}, now=0.0)
    jobs_table.claim_oldest(db, "bench", now=0.0)
    db.conn.close()
    return job_id


def per_sample(db_path: Path, kind: str, n: int, sample) -> float:
    """Seconds per `add` in the child, the relay's storing included (it runs while the adds do)."""
    job_id = new_job(db_path)
    t0 = time.monotonic()
    if kind == "pipe":
        read_fd, write_fd = open_sample_pipe()
        relay_pid = os.fork()
        if relay_pid == 0:  # the supervisor's side, in a process of its own
            os.close(write_fd)
            SampleRelay(db_path, job_id, read_fd).close(timeout=None)
            os._exit(0)
        os.close(read_fd)
        sink = PipeSink(write_fd, t0=t0)
    else:
        sink = DatabaseSink(db_path, job_id, t0=t0, clock=time.monotonic)
    start = time.perf_counter()
    for i in range(n):
        sink.add(sample, rank=0, stage="load", tensors_placed=i, bytes_placed=i * 4096,
                 tensor_name=f"transformer_blocks.{i % 60}.attn.to_q.weight")
    took = time.perf_counter() - start
    sink.close()
    if kind == "pipe":
        os.waitpid(relay_pid, 0)
    return took / n


def per_batch(db_path: Path, durable: bool, batches: int, sample) -> float:
    """Seconds per committed batch of 64 samples."""
    writer = SampleWriter(db_path, new_job(db_path), t0=0.0, batch_size=10**9, flush_interval=3600, durable=durable)
    times = []
    for b in range(batches):
        for i in range(64):
            writer.add(sample, stage="load", tensors_placed=b * 64 + i)
        start = time.perf_counter()
        writer.flush()
        times.append(time.perf_counter() - start)
    writer.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with MemoryProbe() as probe:
        sample = probe.sample()
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        db_path = Path(tmp) / "drainboard.db"
        adds = {"pipe": [], "database": []}
        for _ in range(3):
            for kind in adds:
                adds[kind].append(per_sample(db_path, kind, args.samples, sample))
        commits = {"NORMAL": [], "FULL": []}
        for _ in range(2):
            for mode in commits:
                commits[mode].append(per_batch(db_path, mode == "FULL", args.batches // 2, sample))
    result = {
        "per_sample_us": {k: statistics.median(v) * 1e6 for k, v in adds.items()},
        "per_batch_ms": {k: statistics.median(v) * 1e3 for k, v in commits.items()},
    }
    result["pipe_over_database"] = result["per_sample_us"]["pipe"] / result["per_sample_us"]["database"]
    result["full_over_normal"] = result["per_batch_ms"]["FULL"] / result["per_batch_ms"]["NORMAL"]
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"per sample in the child: pipe {result['per_sample_us']['pipe']:.1f} us, database "
          f"{result['per_sample_us']['database']:.1f} us (pipe / database {result['pipe_over_database']:.2f})")
    print(f"per commit of 64 samples: NORMAL {result['per_batch_ms']['NORMAL']:.2f} ms, FULL "
          f"{result['per_batch_ms']['FULL']:.2f} ms (FULL / NORMAL {result['full_over_normal']:.2f})")


if __name__ == "__main__":
    main()
