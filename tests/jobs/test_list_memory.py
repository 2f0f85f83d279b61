"""`jobs list` prints its table from the columns it shows: its memory grows with the rows printed, not with the
spec and metrics JSON every job stores (a generate's forecast, a load's report), which once made a 1 MB table
of 10,000 jobs cost 1.86 GB."""

from __future__ import annotations

import tracemalloc

from jobs.cli import main
from storage import jobs_table

JOBS = 200
STORED = 100_000
"""Bytes of spec and metrics JSON each job stores (20 MB in all)."""


def test_the_table_costs_a_small_fraction_of_what_the_jobs_store(db, capsys):
    for i in range(JOBS):
        job_id = jobs_table.enqueue(db, "load", {"model": f"/models/m{i}", "component": "transformer",
                                                 "forecast": "f" * (STORED // 2)}, now=1.0)
        jobs_table.set_metrics(db, job_id, {"tensors": ["t" * 1000] * (STORED // 2000)})
        jobs_table.set_error(db, job_id, f"checkpoint {i} is broken\nsecond line", None)
    stored = JOBS * STORED

    tracemalloc.start()
    try:
        assert main(["list", "--limit", "10000"]) == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    table = capsys.readouterr().out
    assert table.count("\n") == JOBS + 1
    assert f"/models/m{JOBS - 1} [transformer]" in table and "checkpoint 0 is broken …" in table
    assert peak < stored / 20, f"peak {peak:,} bytes for {stored:,} bytes of stored JSON"
