"""The System page under AppTest: the pool as the kernel counts it, and memory pressure where the kernel reports it."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]


def test_system_page_shows_in_use_available_free_and_cache_apart(fresh_db):
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "system.py"), default_timeout=60).run()
    assert not at.exception, at.exception
    labels = [m.label for m in at.metric]
    assert labels[:4] == ["System in use", "MemAvailable", "MemFree", "Page cache"]
    assert all(m.value.endswith(("GiB", "MiB", "KiB")) for m in at.metric[:4])


def test_system_page_says_what_cuda_free_follows_on_unified_memory(fresh_db, monkeypatch):
    from dashboard import data
    from machine.device import DeviceInfo, probe_device

    gb10 = DeviceInfo("cuda:0", "cuda", 0, "NVIDIA GB10 (fake)", True, 121 * 2**30, "fake", "a faithful fake of a GB10")
    monkeypatch.setattr(data, "devices", lambda: [probe_device("cpu"), gb10])
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "system.py"), default_timeout=60).run()
    assert any("follows MemFree" in i.value for i in at.info)


def test_system_page_charts_memory_pressure_from_psi(fresh_db, tmp_path, monkeypatch):
    psi = tmp_path / "memory"
    psi.write_text("some avg10=12.50 avg60=3.00 avg300=1.00 total=99\nfull avg10=2.25 avg60=0.50 avg300=0.10 total=9\n")
    monkeypatch.setattr("dashboard.host.PRESSURE", psi)
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "system.py"), default_timeout=60).run()
    caption = next(c.value for c in at.caption if c.value.startswith("From /proc/pressure/memory"))
    assert "12.50% of the time" in caption and "every task at once 2.25%" in caption
    assert "% of time stalled" in str([chart.proto.spec for chart in at.get("vega_lite_chart")])


def test_system_page_says_when_the_kernel_has_no_psi(fresh_db, tmp_path, monkeypatch):
    monkeypatch.setattr("dashboard.host.PRESSURE", tmp_path / "absent")
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "system.py"), default_timeout=60).run()
    assert not at.exception, at.exception
    assert any("does not report memory pressure" in c.value for c in at.caption)


def test_unified_memory_forced_on_a_box_without_cuda_lists_no_phantom_gpus(fresh_db, monkeypatch):
    from dashboard import data
    from machine.device import probe_device

    monkeypatch.setenv("DRAINBOARD_UNIFIED_MEMORY", "1")
    if probe_device("cuda:0", environ={}).source != "probe-failed":
        import pytest

        pytest.fail("this box has a CUDA device; the test needs one without (the GPU case is the device's own)")
    data.devices.clear()
    assert [d.spec for d in data.devices()] == ["cpu"]


def test_the_history_reads_the_samples_jobs_stored_before_the_page_opened(fresh_db, job_adder, load_samples):
    import time

    started = time.time() - 120  # two minutes ago, long before this page's first reading
    job_adder(fresh_db, status="succeeded", samples=load_samples, started_at=started)
    from dashboard import data

    stored = data.host_history(str(fresh_db_path(fresh_db)), started - 1)
    assert len(stored) == len(load_samples)
    assert stored["time"].min() == started and int(stored["available"].min()) == int(load_samples["mem_available"].min())
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "system.py"), default_timeout=60).run()
    assert not at.exception, at.exception
    assert "stored samples" in str([chart.proto.spec for chart in at.get("vega_lite_chart")])


def fresh_db_path(db) -> Path:
    return Path(db.conn.execute("PRAGMA database_list").fetchone()[2])


def test_the_worker_section_says_the_database_is_locked_and_for_how_long(fresh_db):
    import re
    import time

    from storage.lock_waits import LockWait, lock_notice_path

    wait = LockWait("host:123:abcd", lock_notice_path(fresh_db_path(fresh_db)))
    wait.refused(time.time() - 75)  # a worker whose writes have waited 75 s
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "system.py"), default_timeout=60).run()
    assert not at.exception, at.exception
    [warning] = [w.value for w in at.warning if "locked by another process" in w.value]
    assert re.match(r"The job database has been locked by another process for 1 min (1[5-9]|[2-5]\d) s ", warning), warning
    assert "the worker (host:123:abcd) waits and retries its writes, and loses none" in warning
