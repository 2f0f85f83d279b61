"""The dashboard in a real browser: Debian's Chromium driven by Playwright against `streamlit run app.py`.

Screenshots of every step go to tests/_artifacts/ so a failing run can be inspected.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "_artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
JOB_TIMEOUT_MS = 240_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout: float = 90.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"streamlit exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"streamlit did not answer on {url} within {timeout} s: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    """`streamlit run app.py` on a free port with a fresh data folder holding the `tiny`
    checkpoint; yields (base url, data folder). Stops the dashboard and the supervisor it started."""
    data = tmp_path_factory.mktemp("browser") / "data"
    subprocess.run(
        [sys.executable, "-m", "models", "synth", str(data / "models" / "tiny"), "--profile", "tiny"],
        cwd=ROOT, check=True, capture_output=True,
    )
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAINBOARD_")}
    env.update(DRAINBOARD_DATA=str(data), PYTHONPATH=str(ROOT))
    log = data.parent / "streamlit.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port), "--server.headless", "true"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, log)
        yield url, data
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        _stop_supervisor(data)


def _stop_supervisor(data: Path) -> None:
    from jobs.supervisor import supervisor_status
    from storage.connections import connect

    db_path = data / "drainboard.db"
    if not db_path.exists():
        return
    db = connect(db_path, ensure=False)
    status = supervisor_status(db)
    db.conn.close()
    if status["alive"] and status["pid"]:
        os.kill(status["pid"], signal.SIGTERM)


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (never `playwright install`)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def page(browser):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(60_000)
    yield page
    context.close()


def _shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _queue(page, base: str, kind_label: str) -> int:
    """On the Run page: pick the tiny checkpoint and the job kind, queue, land on the Job page."""
    try:
        return _queue_steps(page, base, kind_label)
    finally:
        _shot(page, f"queue-{kind_label.replace(' ', '_').replace('+', 'and')}")


def _queue_steps(page, base: str, kind_label: str) -> int:
    page.goto(base + "/")
    page.get_by_text("Run a job").wait_for()
    page.locator("[data-testid=stSelectbox]").filter(has_text="Checkpoint").click()
    page.get_by_role("option").filter(has_text="tiny").click()
    page.get_by_text("Components of tiny").wait_for()
    page.get_by_role("radio", name=kind_label, exact=True).first.click()
    page.wait_for_timeout(500)
    page.get_by_role("button", name="Queue job").click()
    page.wait_for_url("**/job?job=*")
    return int(page.url.rsplit("=", 1)[1])


def _wait_done(page, job_id: int, name: str) -> None:
    try:
        page.get_by_text("Done in").first.wait_for(timeout=JOB_TIMEOUT_MS)
    finally:
        _shot(page, name)
    assert page.locator("[data-testid=stException]").count() == 0


def test_a_newcomer_loads_generates_downloads_and_compares(dashboard, page, tmp_path):
    base, data = dashboard

    load_id = _queue(page, base, "load")
    _wait_done(page, load_id, "1-load-job")
    # The memory chart drawn (not just the small memory bar of the frame).
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('[data-testid=stVegaLiteChart]'))"
        ".some(c => c.querySelector('canvas, svg') && c.getBoundingClientRect().height > 300)",
        timeout=30_000,
    )
    _shot(page, "1-load-job")
    assert page.get_by_text("Footprint ratio").first.is_visible()
    values = page.locator("[data-testid=stMetricValue]").all_inner_texts()
    assert any(v.strip().endswith("×") for v in values), values

    generate_id = _queue(page, base, "load + generate")
    _wait_done(page, generate_id, "2-generate-job")
    video = page.locator("video").first
    video.wait_for()
    page.wait_for_function(
        "() => { const v = document.querySelector('video'); return v && v.readyState >= 1 && v.duration > 0; }",
        timeout=30_000,
    )
    duration = page.evaluate("() => document.querySelector('video').duration")
    assert duration > 0
    _shot(page, "3-generate-video")

    with page.expect_download() as download_info:
        page.get_by_role("button", name="Video (MP4").click()
    saved = tmp_path / "video.mp4"
    download_info.value.save_as(saved)
    head = saved.read_bytes()[:12]
    assert head[4:8] == b"ftyp", head

    page.goto(f"{base}/compare?jobs={load_id},{generate_id}")
    page.get_by_text("Reference job").wait_for()
    page.locator("[data-testid=stVegaLiteChart] canvas, [data-testid=stVegaLiteChart] svg").first.wait_for()
    page.wait_for_timeout(1500)
    _shot(page, "4-compare")
    table = page.locator("[data-testid=stDataFrame]").first
    assert table.is_visible()
    assert page.locator("[data-testid=stException]").count() == 0
