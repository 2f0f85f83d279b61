"""The dashboard listens on localhost wherever it is started from, and refuses to serve
beyond it unless the Drainboard configuration names that address."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from dashboard.bind import bind_refusal, is_loopback
from tests.dashboard.test_browser import _free_port, _wait_healthy

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_addresses_are_served_whatever_the_configuration(address):
    assert is_loopback(address)
    assert bind_refusal(address, "127.0.0.1") is None


@pytest.mark.parametrize("bound", [None, "", "0.0.0.0", "::", "192.168.1.20"])
def test_an_address_beyond_localhost_is_refused_unless_configured(bound):
    reason = bind_refusal(bound, "127.0.0.1")
    assert reason is not None and "DRAINBOARD_ADDRESS=" in reason
    assert ("every network interface" in reason) == (bound in (None, "", "0.0.0.0", "::"))


@pytest.mark.parametrize("bound, configured", [("0.0.0.0", "0.0.0.0"), (None, "0.0.0.0"), ("::", "0.0.0.0"),
                                               ("192.168.1.20", "192.168.1.20")])
def test_an_address_the_configuration_names_is_served(bound, configured):
    assert bind_refusal(bound, configured) is None


def test_a_configured_interface_does_not_allow_every_interface():
    assert bind_refusal("0.0.0.0", "192.168.1.20") is not None


@pytest.fixture
def bound_everywhere():
    """Streamlit's server.address as `streamlit run app.py --server.address 0.0.0.0` sets it (nothing is bound)."""
    before = st_config.get_option("server.address")
    st_config.set_option("server.address", "0.0.0.0")
    yield
    st_config.set_option("server.address", before)


def test_the_app_serves_nothing_when_bound_everywhere_without_being_asked(data_dir, bound_everywhere, monkeypatch):
    monkeypatch.delenv("DRAINBOARD_ADDRESS", raising=False)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error if "listening on every network interface" in e.value]
    assert not at.title  # no page ran
    assert not (data_dir / "drainboard.db").exists()  # nor did the first-start preparation


def _listening(pid: int, port: int) -> set[str]:
    """Addresses the process tree of `pid` listens on at `port`."""
    procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    return {
        c.laddr.ip for p in procs for c in p.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


def test_streamlit_run_from_another_folder_listens_on_localhost_only(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRAINBOARD_", "STREAMLIT_"))}
    env.update(DRAINBOARD_DATA=str(tmp_path / "data"), PYTHONPATH=str(ROOT))
    log = tmp_path / "streamlit.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(port),
             "--server.headless", "true"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", process, log)
        assert _listening(process.pid, port) == {"127.0.0.1"}
    finally:
        process.terminate()
        process.wait(timeout=20)
