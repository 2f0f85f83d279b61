"""A damaged job database is one line naming the file, in the CLI as on the page; opening never waits 30 s."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from jobs.cli import main
from storage import jobs_table
from storage.connections import DatabaseDamagedError, OPEN_TIMEOUT_MS
from storage.schema import open_database

ROOT = Path(__file__).resolve().parents[2]


def _garble_tables(path: Path) -> None:
    """Random bytes over every page after the first (the jobs table's among them)."""
    db = open_database(path)
    jobs_table.enqueue(db, "load", {}, now=1.0)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.conn.close()
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(os.urandom(size - 4096))


@pytest.fixture
def data(tmp_path, monkeypatch):
    folder = tmp_path / "data"
    (folder / "models").mkdir(parents=True)
    monkeypatch.setenv("DRAINBOARD_DATA", str(folder))
    monkeypatch.delenv("DRAINBOARD_MODEL_ROOTS", raising=False)
    monkeypatch.delenv("DRAINBOARD_CONFIG", raising=False)
    return folder


def test_garbage_over_the_tables_is_one_line_naming_the_file(data, capsys):
    _garble_tables(data / "drainboard.db")
    assert main(["list", "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error.startswith(f"the job database at {data / 'drainboard.db'} is damaged: ")
    assert main(["list"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_page_shows_the_same_line_without_a_traceback(data):
    import streamlit as st

    _garble_tables(data / "drainboard.db")
    st.cache_data.clear()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error if e.value.startswith(f"the job database at {data / 'drainboard.db'} is damaged")]


def test_a_database_truncated_under_a_live_connection_is_said_within_seconds(data):
    path = data / "drainboard.db"
    holder = open_database(path)  # the worker
    job_id = jobs_table.enqueue(holder, "load", {}, now=1.0)
    os.truncate(path, 0)
    jobs_table.set_stage(holder, job_id, "load")  # a write through the truncated file
    started = time.monotonic()
    with pytest.raises(DatabaseDamagedError, match=f"the job database at {path} stayed locked for 3 s on opening"):
        open_database(path)
    assert time.monotonic() - started < OPEN_TIMEOUT_MS / 1000 + 5
    holder.conn.close()


def test_a_bad_setting_is_one_line_on_the_page(data, monkeypatch):
    import streamlit as st

    monkeypatch.setenv("DRAINBOARD_MEMORY_FLOOR", "lots")
    st.cache_data.clear()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error if e.value.startswith("memory_floor (DRAINBOARD_MEMORY_FLOOR or drainboard.toml)")]
    assert not (data / "drainboard.db").exists()  # nothing was prepared with it
