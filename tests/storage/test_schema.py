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
