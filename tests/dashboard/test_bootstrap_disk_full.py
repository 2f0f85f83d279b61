"""First start on a disk too small for the demo checkpoint: a clear error, nothing half-written, the database usable."""

from __future__ import annotations

import pytest

from dashboard.bootstrap import demo_missing, demo_path, prepare
from storage.config import Config
from storage.schema import open_database


@pytest.mark.slow
def test_first_start_on_a_small_disk_reports_the_demo_error_and_keeps_the_database(small_tmpfs):
    disk = small_tmpfs(512 * 1024)
    config = Config(data_dir=disk / "data", model_roots=[disk / "models"])
    prepared = prepare(config, start_worker=False)
    assert not prepared.wrote_demo and demo_missing(config)
    assert prepared.demo_error.startswith(
        f"not enough disk space in {demo_path(config)}: the demo checkpoint needs ")
    assert prepared.demo_error.endswith(" bytes free") and "\n" not in prepared.demo_error
    db = open_database(config.db_path)
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    db.conn.close()
