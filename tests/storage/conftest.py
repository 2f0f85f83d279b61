import pytest

from machine.memory import MemorySample
from storage.schema import open_database


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

    def add(db, kind: str = "load", spec: str = '{"model": "/m"}', status: str = "queued") -> int:
        cursor = db.execute(
            "INSERT INTO jobs (kind, spec, status, created_at) VALUES (?, ?, ?, 0)", [kind, spec, status]
        )
        return cursor.lastrowid

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
