import sqlite3

import pytest

from storage.connections import connect
from storage.schema import SAMPLE_COLUMNS, SCHEMA_VERSION, SchemaError, ensure_schema, open_database, schema_version


def test_connect_turns_on_wal_and_a_busy_timeout(fresh_db):
    assert fresh_db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert fresh_db.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000


def test_connect_leaves_the_schema_to_whoever_opens_the_database_for_the_product(db_path):
    bare = connect(db_path)
    assert bare.table_names() == [] and schema_version(bare) == 0
    bare.conn.close()
    migrated = open_database(db_path)
    assert schema_version(migrated) == SCHEMA_VERSION and "jobs" in migrated.table_names()
    migrated.conn.close()


def test_ensure_schema_is_idempotent_and_sets_the_version(fresh_db):
    assert ensure_schema(fresh_db) == SCHEMA_VERSION
    assert ensure_schema(fresh_db) == SCHEMA_VERSION
    assert schema_version(fresh_db) == SCHEMA_VERSION
    assert set(fresh_db.table_names()) >= {"jobs", "samples", "events", "artifacts", "supervisors"}


def test_samples_table_has_exactly_the_documented_columns(fresh_db):
    assert tuple(c.name for c in fresh_db["samples"].columns) == SAMPLE_COLUMNS


def test_a_database_from_a_newer_version_is_refused(db_path):
    conn = sqlite3.connect(db_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaError, match="newer than this Drainboard"):
        open_database(db_path)


def test_migrating_an_old_database_backfills_the_block_extremes_the_sample_writer_keeps(db_path):
    from storage import jobs_table
    from storage.sample_writer import block_extremes, sample_row
    from storage.schema import _MIGRATIONS

    conn = sqlite3.connect(db_path)
    for statement in _MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    jobs_table.enqueue(conn, "load", {}, now=0.0)  # the first schema has every column a queued row needs
    rows = {0: [], 1: []}
    for seq in range(300):  # samples as schema 1 held them, written by hand: no extremes yet
        row = sample_row(job_id=1, seq=seq, rank=seq % 2, t=0, vm_rss=(seq * 31) % 97, mem_available=10**9 - seq)
        conn.execute(f"INSERT INTO samples ({', '.join(SAMPLE_COLUMNS)}) VALUES ({', '.join('?' * len(row))})", row)
        rows[seq % 2].append(row)
    conn.commit()
    conn.close()
    db = open_database(db_path)
    stored = set(db.execute("SELECT job_id, rank, col, block, lo, lo_seq, hi, hi_seq FROM sample_extremes").fetchall())
    assert stored == {e for rank, found in rows.items() for e in block_extremes(1, rank, found)}
    db.conn.close()
