"""The worker log is offered from its end, at most `LOG_OFFERED` bytes, and the page says so with the whole
file's path: Streamlit 1.67 holds whatever a download offers in the server's memory (nothing streams), so a
1 GiB log offered whole cost 1 GB per download. Measured in bytes read, not time."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from streamlit.testing.v1 import AppTest

from dashboard.views.downloads import LOG_OFFERED, log_tail
from storage.artifacts import new_artifact_path, record_artifact

ROOT = Path(__file__).resolve().parents[2]


def _write_log(path: Path, size: int) -> bytes:
    line = b"step 123456: placed blocks.7.attn.to_q.weight, 32 MiB\n"
    body = line * (size // len(line)) + b"Traceback: the last words\n"
    path.write_bytes(body)
    return body


def test_the_tail_of_a_large_log_is_its_last_lines_and_costs_what_it_offers(tmp_path):
    log = tmp_path / "child.log"
    body = _write_log(log, 16 * 2**20)
    limit = 2**20
    tracemalloc.start()
    try:
        tail = log_tail(log, limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(tail) <= limit and body.endswith(tail) and tail.endswith(b"the last words\n")
    assert body[len(body) - len(tail) - 1: len(body) - len(tail)] == b"\n"  # it starts at a line's start
    assert peak < 3 * limit, f"{peak:,} bytes held to offer {limit:,} of a {len(body):,}-byte log"
    small = tmp_path / "small.log"
    small.write_bytes(b"one line, no newline")
    assert log_tail(small, limit) == b"one line, no newline"


def test_the_job_page_offers_a_large_logs_end_and_says_where_the_whole_file_is(fresh_db, data_dir, job_adder,
                                                                               load_samples):
    job_id = job_adder(fresh_db, status="failed", samples=load_samples)
    log = new_artifact_path(data_dir, job_id, "child", ".log")
    _write_log(log, LOG_OFFERED + 2**20)
    record_artifact(fresh_db, data_dir, job_id, log)
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "job.py"), default_timeout=60)
    at.query_params["job"] = str(job_id)
    at.run()
    assert not at.exception, at.exception
    assert "Worker log (child.log, last 8 MiB)" in [b.proto.label for b in at.get("download_button")]
    assert (f"The worker log child.log is 9 MiB: the download offers its last 8 MiB (where a failure is said). "
            f"The whole file is on the server at {log}.") in [c.value for c in at.caption]
