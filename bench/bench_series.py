"""Time the downsampled series query the Job page draws from, at 200,000 and 2,000 samples.

    python bench/bench_series.py [--samples 200000 2000] [--json]

For each size: a fresh database, one job's samples written through the
batched SampleWriter (ingest rate, including the per-block extremes), then
`storage.queries.sample_series` with the dashboard's chart columns and with
all six default columns, and, for comparison, the same bucketing done by
scanning every sample (the path short series take). One run each.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine.memory import MemorySample  # noqa: E402
from storage import jobs_table, queries  # noqa: E402
from storage.schema import open_database  # noqa: E402
from storage.sample_writer import SampleWriter  # noqa: E402

CHART_COLUMNS = ("vm_rss", "rss_file", "device_allocated", "mem_available")
"""The columns dashboard.data.CHART_COLUMNS asks for (not imported: that pulls in Streamlit)."""


def fill(db_path: Path, samples: int) -> tuple[int, float]:
    """A job with `samples` made-up samples (a rising curve with ripple and one spike); returns (job, seconds)."""
    db = open_database(db_path)
    job = jobs_table.enqueue(db, "load", {}, now=0.0)
    db.conn.close()
    start = time.perf_counter()
    with SampleWriter(db_path, job, t0=0.0) as writer:
        for i in range(samples):
            rss = 2**30 + i * 4096 + int(2**20 * math.sin(i / 7))
            if i == samples * 2 // 3:
                rss += 2**33
            writer.add(MemorySample(t=i * 1e-3, vm_rss=rss, rss_anon=rss // 2, rss_file=rss // 3, vm_hwm=rss,
                                    mem_available=2**36 - rss, device_allocated=i * 1024), stage="load")
    return job, time.perf_counter() - start


def timed(fn) -> tuple[float, int]:
    start = time.perf_counter()
    rows = fn()
    return time.perf_counter() - start, len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, nargs="+", default=[200_000, 2_000])
    parser.add_argument("--max-points", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    for samples in args.samples:
        with tempfile.TemporaryDirectory() as tmp:
            db_path = Path(tmp) / "drainboard.db"
            job, ingest = fill(db_path, samples)
            db = open_database(db_path)
            chart_s, chart_rows = timed(lambda: queries.sample_series(
                db, job, max_points=args.max_points, columns=CHART_COLUMNS))
            six_s, six_rows = timed(lambda: queries.sample_series(db, job, max_points=args.max_points))
            scan_s, _ = timed(lambda: list(queries._pick_from_samples(
                db, job, 0, 0, samples - 1, (args.max_points - 2) // (2 * len(CHART_COLUMNS)), CHART_COLUMNS)))
            db.conn.close()
        results.append({
            "samples": samples, "ingest_samples_per_s": round(samples / ingest),
            "chart_columns_ms": round(chart_s * 1e3, 1), "chart_rows": chart_rows,
            "six_columns_ms": round(six_s * 1e3, 1), "six_rows": six_rows,
            "per_sample_scan_ms": round(scan_s * 1e3, 1),
        })
        print(f"{samples} samples: ingest {samples / ingest:,.0f}/s; series (chart columns) {chart_s * 1e3:.1f} ms, "
              f"{chart_rows} rows; six columns {six_s * 1e3:.1f} ms, {six_rows} rows; "
              f"per-sample scan of the chart columns {scan_s * 1e3:.1f} ms", file=sys.stderr)
    if args.json:
        print(json.dumps({"max_points": args.max_points, "runs": results}))


if __name__ == "__main__":
    main()
