"""`storage.jobs_table` is the one writer of the `jobs` table: no other source file (product, bench or test)
writes it with SQL or sqlite-utils' table API, and its transitions do what their names say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from storage import jobs_table
from storage.queries import get_job

ROOT = Path(__file__).resolve().parents[2]
OWNER = ROOT / "storage" / "jobs_table.py"
SCHEMA = ROOT / "storage" / "schema.py"
"""The table's definition and its append-only migrations: the one other file that may shape the table."""
SKIPPED_DIRS = {"node_modules", "site-packages", "_artifacts"}
"""Besides hidden folders (.git, a CI virtualenv): folders of files that are not this project's source."""
JOBS_WRITE = re.compile(
    r"""\b(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|REPLACE\s+INTO|UPDATE(?:\s+OR\s+\w+)?|DELETE\s+FROM)\s+["'`]?jobs\b"""
    r"""|\[\s*["']jobs["']\s*\]\s*\.\s*(?:insert|upsert|update|delete|insert_all|upsert_all|delete_where|transform"""
    r"""|add_column|drop)\b"""
    r"""|\.table\(\s*["']jobs["']""",
    re.IGNORECASE,
)


def _sources() -> list[Path]:
    return [p for p in ROOT.rglob("*.py") if not any(part in SKIPPED_DIRS or part.startswith(".")
                                                     for part in p.relative_to(ROOT).parts[:-1])]


def _writes(path: Path) -> list[str]:
    text = path.read_text(errors="replace")
    return [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
            for m in JOBS_WRITE.finditer(text)]


def test_no_module_but_the_owner_writes_the_jobs_table():
    here = Path(__file__).resolve()
    offenders = [w for p in _sources() if p.resolve() not in (OWNER, SCHEMA, here) for w in _writes(p)]
    assert offenders == [], "write the jobs table through storage.jobs_table instead:\n" + "\n".join(offenders)


@pytest.mark.parametrize("line", [
    'db.execute("UPDATE jobs SET stage = ? WHERE id = ?", [s, i])',
    "conn.execute(\"INSERT INTO jobs (kind, spec, created_at) VALUES ('load', '{}', 0)\")",
    'conn.execute("DELETE FROM jobs WHERE id = ?", [i])',
    'db["jobs"].insert({"kind": "load"})',
    "db.table('jobs').upsert(row)",
    'db.execute("""\n    update   jobs set pid = ?""")',
])
def test_the_scan_sees_every_way_of_writing_the_table(line):
    assert JOBS_WRITE.search(line)


@pytest.mark.parametrize("line", [
    'db.query("SELECT * FROM jobs WHERE id = ?", [i])',
    'at.query_params["jobs"] = "1,2"',
    'conn.execute("UPDATE jobs_archive SET x = 1")',
    'db.execute("INSERT INTO samples (job_id) VALUES (?)", [i])',
])
def test_the_scan_leaves_reads_and_other_tables_alone(line):
    assert not JOBS_WRITE.search(line)


def test_the_owner_is_where_the_writes_are():
    assert len(_writes(OWNER)) >= 10


def test_a_cancel_request_ends_a_queued_job_flags_a_running_one_and_leaves_a_finished_one(fresh_db):
    queued, running, done = (jobs_table.enqueue(fresh_db, "load", {}, now=1.0) for _ in range(3))
    jobs_table.start(fresh_db, running, supervisor_id="s", now=2.0)
    jobs_table.finish(fresh_db, done, "succeeded", now=3.0)
    assert [jobs_table.request_cancel(fresh_db, i, now=4.0) for i in (queued, running, done, 99)] == \
        ["queued", "running", "succeeded", None]
    assert get_job(fresh_db, queued)["status"] == "cancelled" and get_job(fresh_db, queued)["finished_at"] == 4.0
    assert get_job(fresh_db, running)["status"] == "running" and get_job(fresh_db, running)["cancel_requested"] == 1
    assert get_job(fresh_db, done)["status"] == "succeeded" and get_job(fresh_db, done)["cancel_requested"] == 0


def test_finish_merges_metrics_keeps_the_childs_error_and_ends_a_job_only_once(fresh_db):
    job = jobs_table.enqueue(fresh_db, "load", {"model": "/m"}, now=1.0)
    assert jobs_table.claim_oldest(fresh_db, "s", boot_id="b", now=2.0) == job
    assert jobs_table.claim_oldest(fresh_db, "s") is None
    jobs_table.set_metrics(fresh_db, job, {"bytes_placed": 5})
    jobs_table.set_error(fresh_db, job, "CheckpointError: bad", "detail")
    with pytest.raises(ValueError, match="'running' is not a final status"):
        jobs_table.finish(fresh_db, job, "running")
    assert jobs_table.finish(fresh_db, job, "failed", exit_code=1, metrics={"memory_limit": 7}, now=9.0)
    assert not jobs_table.finish(fresh_db, job, "succeeded")
    row = get_job(fresh_db, job)
    assert (row["status"], row["error"], row["error_detail"], row["exit_code"], row["finished_at"]) == \
        ("failed", "CheckpointError: bad", "detail", 1, 9.0)
    assert row["metrics"] == {"bytes_placed": 5, "memory_limit": 7}
    assert (row["started_at"], row["heartbeat_at"], row["supervisor_id"], row["boot_id"]) == (2.0, 2.0, "s", "b")


def test_a_stage_from_outside_never_hides_the_jobs_own(fresh_db):
    job = jobs_table.enqueue(fresh_db, "load", {})
    jobs_table.set_stage_unless_set(fresh_db, job, "waiting for Ray")
    assert get_job(fresh_db, job)["stage"] == "waiting for Ray"
    jobs_table.set_stage(fresh_db, job, "load")
    jobs_table.set_stage_unless_set(fresh_db, job, "waiting for Ray")
    assert get_job(fresh_db, job)["stage"] == "load"
