"""Server time to build the Job page for a finished load with 2k and with 200k samples.

    python bench/bench_dashboard.py            (about a minute on a 2-core box)

Each size gets a fresh data folder and database with one succeeded load job
whose samples look like a real load (VmRSS climbing, MemAvailable falling, a
spike per 1000 tensors). The page runs under Streamlit's AppTest, so the time
is the whole server-side script: the query with its peak-keeping downsampling,
the data frames, the Altair spec. The first run of each size is cold (empty
caches); the second is warm. Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GIB = 2**30


def _make_job(data: Path, samples: int) -> int:
    from jobs.spec import JobSpec
    from machine.memory import MemorySample
    from storage import jobs_table
    from storage.schema import open_database
    from storage.sample_writer import SampleWriter

    db = open_database(data / "drainboard.db")
    spec = JobSpec(kind="load", model=str(data / "models" / "none"), mode="drain")
    created = time.time()
    job_id = jobs_table.enqueue(db, spec.kind, spec.to_dict(), now=created)
    jobs_table.claim_oldest(db, "bench", now=created)
    db.conn.close()
    i = np.arange(samples)
    placed = (i + 1) * (40 * GIB // samples)
    spike = np.where(i % 1000 == 999, 2 * GIB, 0)
    # Through the job child's own writer, so the per-block extremes the series query reads exist.
    with SampleWriter(data / "drainboard.db", job_id, t0=0.0, batch_size=4096) as writer:
        for k in range(samples):
            rss = int(GIB + placed[k] * 116 // 100 + spike[k])
            writer.add(
                MemorySample(t=k * 0.01, vm_rss=rss, rss_anon=int(GIB + placed[k]), rss_file=int(placed[k] // 6),
                             vm_hwm=rss, mem_available=int(100 * GIB - rss)),
                stage="load", tensors_placed=k + 1, bytes_placed=int(placed[k]),
                tensor_name=f"transformer_blocks.{k % 50}.ff.fc_in.weight",
            )
    db = open_database(data / "drainboard.db")
    metrics = {"bytes_placed": int(placed[-1]), "footprint_ratio": 1.16, "load_seconds": samples * 0.01}
    jobs_table.finish(db, job_id, "succeeded", metrics=metrics, now=created + samples * 0.01)
    db.conn.close()
    return job_id


def _time_page(job_id: int) -> tuple[float, str]:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "job.py"), default_timeout=300)
    at.query_params["job"] = str(job_id)
    start = time.perf_counter()
    at.run()
    took = time.perf_counter() - start
    if at.exception:
        raise RuntimeError(f"job page failed: {at.exception}")
    drawn = next(c.value.split(".")[0] for c in at.caption if "samples" in c.value)
    return took, drawn


def main() -> None:
    import streamlit as st

    results = {}
    for samples in (2_000, 200_000):
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "data"
            (data / "models").mkdir(parents=True)
            os.environ["DRAINBOARD_DATA"] = str(data)
            os.environ["DRAINBOARD_MODEL_ROOTS"] = str(data / "models")
            st.cache_data.clear()
            job_id = _make_job(data, samples)
            cold, drawn = _time_page(job_id)
            warm, _ = _time_page(job_id)
            results[f"{samples}_samples"] = {"cold_s": round(cold, 3), "warm_s": round(warm, 3), "chart": drawn}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
