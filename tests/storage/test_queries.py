import csv
import io

import pytest

from storage.queries import (
    artifacts, count_jobs, events, get_job, job_choices, last_sample, list_jobs, sample_series, samples_csv,
    samples_since,
)
from storage.events_table import add_event
from storage.sample_writer import SampleWriter
from storage.schema import EXTREME_COLUMNS, EXTREMES_BLOCK


@pytest.fixture
def db_with_samples(fresh_db, db_path, add_job, memory_sample):
    """Job 1 with 20,000 samples: rss rising with two one-sample spikes (seq 7,001 up, 13,001 down)."""
    job = add_job(fresh_db, status="running")
    with SampleWriter(db_path, job, t0=0.0, batch_size=5000) as writer:
        for i in range(20_000):
            rss = 10_000 + i
            if i == 7001:
                rss = 10**9
            if i == 13_001:
                rss = 5
            writer.add(memory_sample(i, vm_rss=rss), stage="load", tensors_placed=i)
    return fresh_db


def test_list_jobs_filters_by_status_kind_and_search_newest_first(fresh_db, add_job):
    a = add_job(fresh_db, "load", '{"model": "/m/alpha"}', "succeeded")
    b = add_job(fresh_db, "generate", '{"model": "/m/beta", "prompt": "a cat"}', "failed")
    c = add_job(fresh_db, "load", '{"model": "/m/beta"}', "queued")
    assert [j["id"] for j in list_jobs(fresh_db)] == [c, b, a]
    assert [j["id"] for j in list_jobs(fresh_db, status="failed")] == [b]
    assert [j["id"] for j in list_jobs(fresh_db, status=["queued", "succeeded"])] == [c, a]
    assert [j["id"] for j in list_jobs(fresh_db, kind="load", search="BETA")] == [c]
    assert list_jobs(fresh_db, limit=1, offset=1)[0]["spec"] == {"model": "/m/beta", "prompt": "a cat"}
    assert get_job(fresh_db, a)["spec"]["model"] == "/m/alpha"
    assert get_job(fresh_db, 999) is None


def test_jobs_filter_by_mode_and_checkpoint_or_prompt_and_count_over_the_whole_table(fresh_db, add_job):
    a = add_job(fresh_db, "load", '{"model": "/m/alpha", "mode": "drain"}', "succeeded")
    b = add_job(fresh_db, "generate", '{"model": "/m/beta", "mode": "stream", "generate": {"prompt": "a Fox"}}', "failed")
    c = add_job(fresh_db, "load", '{"model": "/m/beta", "mode": "stream", "device": "fox"}', "queued")
    for _ in range(300):
        add_job(fresh_db, "load", '{"model": "/m/gamma", "mode": "retain"}', "succeeded")
    assert [j["id"] for j in list_jobs(fresh_db, modes=["drain", "stream"])] == [c, b, a]
    assert [j["id"] for j in list_jobs(fresh_db, about="fox")] == [b]  # the prompt, not any other spec field
    assert [j["id"] for j in list_jobs(fresh_db, about="beta", kind=["load", "generate"])] == [c, b]
    assert list_jobs(fresh_db, modes=[]) == []
    assert count_jobs(fresh_db) == {"succeeded": 301, "failed": 1, "queued": 1}  # never capped at a page
    assert count_jobs(fresh_db, kind="load", modes=["stream", "retain"]) == {"succeeded": 300, "queued": 1}
    assert job_choices(fresh_db) == (["generate", "load"], ["drain", "retain", "stream"])


def test_a_short_series_comes_back_whole(fresh_db, db_path, add_job, memory_sample):
    job = add_job(fresh_db)
    with SampleWriter(db_path, job, t0=0.0) as writer:
        for i in range(10):
            writer.add(memory_sample(i))
    assert [r["seq"] for r in sample_series(fresh_db, job)] == list(range(10))


def test_a_long_series_is_downsampled_but_keeps_spikes_first_and_last(db_with_samples):
    rows = sample_series(db_with_samples, 1, max_points=1500)
    seqs = [r["seq"] for r in rows]
    assert 100 < len(rows) <= 1500
    assert seqs == sorted(seqs)
    assert {0, 7001, 13_001, 19_999} <= set(seqs)
    assert max(r["vm_rss"] for r in rows) == 10**9
    assert min(r["vm_rss"] for r in rows) == 5


def test_series_columns_are_checked(db_with_samples):
    with pytest.raises(ValueError, match="unknown sample columns \\['tensor_name'\\]"):
        sample_series(db_with_samples, 1, columns=["tensor_name"])


def test_incremental_fetch_returns_only_newer_samples(db_with_samples):
    rows = samples_since(db_with_samples, 1, 19_997)
    assert [r["seq"] for r in rows] == [19_998, 19_999]
    assert last_sample(db_with_samples, 1)["seq"] == 19_999


def test_samples_csv_streams_a_header_and_every_row(db_with_samples):
    chunks = list(samples_csv(db_with_samples, 1, chunk=3000))
    assert len(chunks) > 1
    table = list(csv.DictReader(io.StringIO("".join(chunks))))
    assert len(table) == 20_000
    assert table[7001]["vm_rss"] == str(10**9)


def test_events_and_artifacts_of_a_job_come_back_in_order(fresh_db, add_job):
    job = add_job(fresh_db)
    for i, kind in enumerate(["stage_start", "decision"]):
        add_event(fresh_db, job, kind, "m", t=float(i), data={"flag": "dit_cpu_offload"}, created_at=0)
    rows = events(fresh_db, job)
    assert [e["kind"] for e in rows] == ["stage_start", "decision"]
    assert rows[1]["data"] == {"flag": "dit_cpu_offload"}
    assert [e["kind"] for e in events(fresh_db, job, since_id=rows[0]["id"])] == ["decision"]
    assert artifacts(fresh_db, job) == []


def _extremes_by_scan(db, job_id: int) -> set[tuple]:
    """Every (rank, col, block, lo, lo_seq, hi, hi_seq) computed straight from the samples, first row on ties."""
    rows = list(db.query("SELECT * FROM samples WHERE job_id = ? ORDER BY rank, seq", [job_id]))
    out: dict[tuple, list] = {}
    for row in rows:
        for col in EXTREME_COLUMNS:
            value = row[col]
            if value is None:
                continue
            key = (row["rank"], col, row["seq"] // EXTREMES_BLOCK)
            ext = out.setdefault(key, [value, row["seq"], value, row["seq"]])
            if value < ext[0]:
                ext[0:2] = [value, row["seq"]]
            if value > ext[2]:
                ext[2:4] = [value, row["seq"]]
    return {(*key, *ext) for key, ext in out.items()}


def _stored_extremes(db, job_id: int) -> set[tuple]:
    return set(db.execute(
        "SELECT rank, col, block, lo, lo_seq, hi, hi_seq FROM sample_extremes WHERE job_id = ?", [job_id]
    ).fetchall())


def test_block_extremes_stay_exact_when_blocks_span_several_batches(fresh_db, db_path, add_job, memory_sample):
    job = add_job(fresh_db)
    values = [(i * 7919) % 1000 for i in range(500)]  # scrambled, so extremes fall mid-block
    with SampleWriter(db_path, job, t0=0.0, batch_size=7) as writer:
        for i, value in enumerate(values):
            writer.add(memory_sample(i, vm_rss=value, device_allocated=None if i % 3 else value))
    assert _stored_extremes(fresh_db, job) == _extremes_by_scan(fresh_db, job)


def test_a_medium_series_downsampled_from_samples_keeps_spikes(fresh_db, db_path, add_job, memory_sample):
    """3,000 samples are fewer blocks than buckets: the per-sample path does the bucketing."""
    job = add_job(fresh_db)
    with SampleWriter(db_path, job, t0=0.0) as writer:
        for i in range(3000):
            writer.add(memory_sample(i, vm_rss=10**9 if i == 1234 else 1000 + i))
    rows = sample_series(fresh_db, job, max_points=2000, columns=["vm_rss"])
    assert 500 < len(rows) <= 2000
    assert {0, 1234, 2999} <= {r["seq"] for r in rows}


def test_every_rank_keeps_its_own_peak_within_the_budget(fresh_db, db_path, add_job, memory_sample):
    job = add_job(fresh_db)
    for rank, spike in ((0, 4321), (1, 17)):
        with SampleWriter(db_path, job, t0=0.0, rank=rank, batch_size=1000) as writer:
            for i in range(8000):
                writer.add(memory_sample(i, vm_rss=10**9 + rank if i == spike else 1000 + (i % 50)))
    rows = sample_series(fresh_db, job, max_points=1000, columns=["vm_rss", "mem_available"])
    assert len(rows) <= 1000
    peaks = {r["rank"]: r for r in rows if r["vm_rss"] >= 10**9}
    assert {rank: r["seq"] for rank, r in peaks.items()} == {0: 4321, 1: 17}
    for rank in (0, 1):
        seqs = [r["seq"] for r in rows if r["rank"] == rank]
        assert seqs[0] == 0 and seqs[-1] == 7999 and seqs == sorted(seqs)
