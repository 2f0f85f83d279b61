import json

import pytest

from machine.memory import MemorySample
from storage import jobs_table
from storage.schema import open_database
from storage.schema import FINAL_STATUSES


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "drainboard.db"


@pytest.fixture
def fresh_db(db_path):
    db = open_database(db_path)
    yield db
    db.conn.close()


@pytest.fixture
def add_job():
    """Inserts a bare job row into a database; returns its id."""

    def add(db, kind: str = "load", spec: str = '{"model": "/m"}', status: str = "queued",
            retry_of: int | None = None) -> int:
        job_id = jobs_table.enqueue(db, kind, json.loads(spec), retry_of=retry_of, now=0.0)
        if status != "queued":
            jobs_table.start(db, job_id, supervisor_id="test", now=0.0)
        if status in FINAL_STATUSES:
            jobs_table.finish(db, job_id, status, now=0.0)
        return job_id

    return add


@pytest.fixture
def memory_sample():
    """Makes a made-up sample whose fields differ by `i` (rss grows, MemAvailable shrinks)."""

    def make(i: int, **overrides) -> MemorySample:
        values = dict(
            t=float(i), vm_rss=1000 + i, rss_anon=500 + i, rss_file=10, vm_hwm=1000 + i, mem_available=10**9 - i
        )
        values.update(overrides)
        return MemorySample(**values)

    return make
