"""A database that cannot be opened or written is one line naming the file and why, never a traceback; reads
work on read-only media (opening them sets nothing, WAL mode included)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from jobs.cli import main
from jobs.supervisor import Supervisor, WorkerGone
from storage import jobs_table
from storage.config import load_config
from storage.queries import get_job
from storage.schema import open_database


@pytest.fixture
def data(tmp_path, monkeypatch):
    def use(folder):
        (folder / "models").mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv("DRAINBOARD_DATA", str(folder))
        return folder

    monkeypatch.delenv("DRAINBOARD_MODEL_ROOTS", raising=False)
    monkeypatch.delenv("DRAINBOARD_CONFIG", raising=False)
    return use


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.removeprefix("error: ").rstrip("\n")


def test_a_directory_in_the_databases_place_is_one_line(data, tmp_path, capsys):
    folder = data(tmp_path / "data")
    (folder / "drainboard.db").mkdir()
    for argv in (["list"], ["show", "1"], ["cancel", "1"]):
        assert main(argv) == 2
        assert _one_error_line(capsys) == (f"the job database at {folder / 'drainboard.db'} is a directory, not a "
                                           f"database file; move it aside (the next start creates an empty database "
                                           f"there)")


@pytest.mark.parametrize("index_left", [True, False], ids=["shm-left-by-the-last-worker", "no-shm"])
def test_list_and_show_read_a_database_on_read_only_media(data, small_tmpfs, capsys, index_left):
    disk = small_tmpfs(8 * 2**20, name="media")
    folder = data(disk / "data")
    db = open_database(folder / "drainboard.db")
    job_id = jobs_table.enqueue(db, "load", {"model": "/models/tiny"}, now=1.0)
    db.conn.close()
    if not index_left:
        (folder / "drainboard.db-shm").unlink(missing_ok=True)
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    before = sorted(os.listdir(folder))

    assert main(["list", "--json"]) == 0
    assert [j["id"] for j in json.loads(capsys.readouterr().out)["jobs"]] == [job_id]
    assert main(["show", str(job_id), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "queued"
    assert main(["cancel", str(job_id)]) == 2
    assert _one_error_line(capsys) == (
        f"the job database at {folder / 'drainboard.db'} cannot be written: {folder} is on a read-only filesystem; "
        f"reading works (`python -m jobs list`, `show`), queueing and running jobs need a writable data folder")
    assert sorted(os.listdir(folder)) == before


def test_a_write_ahead_log_deleted_under_the_worker_is_one_line_and_the_worker_stops_keeping_its_writes(
    data, tmp_path, capsys
):
    folder = data(tmp_path / "data")
    supervisor = Supervisor(load_config())
    job_id = jobs_table.enqueue(supervisor.db, "load", {"model": "/models/tiny"}, now=1.0)
    wal = folder / "drainboard.db-wal"
    wal.unlink()
    jobs_table.set_stage(supervisor.db, job_id, "kept")  # a write only the deleted log holds

    assert main(["list"]) == 2
    assert _one_error_line(capsys).startswith(
        f"the job database at {folder / 'drainboard.db'} cannot be read: its write-ahead log {wal} was deleted "
        f"while a process had the database open")
    with pytest.raises(WorkerGone, match=f"the write-ahead log {wal} of the job database was deleted"):
        supervisor.tick()
    supervisor.db.conn.close()  # what the worker does as it stops
    reader = open_database(folder / "drainboard.db")
    assert get_job(reader, job_id)["stage"] == "kept"
    reader.conn.close()


def test_a_write_refused_for_another_process_lock_is_one_line_and_reads_go_on(data, tmp_path, capsys,
                                                                              hold_write_lock, monkeypatch):
    from storage import connections

    folder = data(tmp_path / "data")
    db = open_database(folder / "drainboard.db")
    job_id = jobs_table.enqueue(db, "load", {"model": "/models/tiny"}, now=1.0)
    db.conn.close()
    monkeypatch.setattr(connections, "BUSY_TIMEOUT_MS", 200)
    holder = hold_write_lock(folder / "drainboard.db", 3.0)
    assert main(["list", "--json"]) == 0  # a reader never waits for a writer
    assert [j["id"] for j in json.loads(capsys.readouterr().out)["jobs"]] == [job_id]
    assert main(["cancel", str(job_id)]) == 2
    assert _one_error_line(capsys) == (f"the job database at {folder / 'drainboard.db'} is locked by another "
                                       f"process (a write or an open transaction held past 0.2 s); try again once "
                                       f"it ends")
    holder.kill()
