"""The dashboard in a real browser: Debian's Chromium driven by Playwright against `streamlit run app.py`.

Screenshots of every step go to tests/_artifacts/ so a failing run can be inspected; the
pages of a killed, a generate and compared jobs are also shot at 1024 and 1400 px, light and
dark. Every wait is for a condition on the page, never a fixed sleep.
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
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]

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
    from jobs.presence import supervisor_status
    from storage.connections import connect

    db_path = data / "drainboard.db"
    if not db_path.exists():
        return
    db = connect(db_path)
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
    choice = page.get_by_role("radio", name=kind_label, exact=True).first
    if choice.get_attribute("aria-checked") != "true":  # clicking the chosen one would unselect it
        choice.click()
    expect(choice).to_be_checked()
    queue = page.get_by_role("button", name="Queue job")
    expect(queue).to_have_count(1)  # the rerun the choice started has replaced the stale form
    queue.click()
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

    # The generate job's page says what was asked for.
    assert page.get_by_text("Prompt:").first.is_visible()
    params = page.locator("[data-testid=stTable]").first
    assert params.get_by_text("seed", exact=True).is_visible()

    page.goto(f"{base}/compare?jobs={load_id},{generate_id}")
    page.get_by_text("Reference job").wait_for()
    _wait_chart_drawn(page)
    _shot(page, "4-compare")
    table = page.locator("[data-testid=stDataFrame]").first
    assert table.is_visible()
    assert page.locator("[data-testid=stException]").count() == 0
    for name, url in (("load", f"/job?job={load_id}"), ("generate", f"/job?job={generate_id}"),
                      ("compare", f"/compare?jobs={load_id},{generate_id}"), ("history", "/history")):
        _shoot_everywhere(page.context.browser, base + url, f"5-{name}", chart=name != "history",
                          last="Events (JSONL)" if url.startswith("/job") else None)


def _wait_chart_drawn(page, min_height: int = 100) -> None:
    """Until a Vega chart has drawn something of at least `min_height` px (the frame's bar is smaller)."""
    page.wait_for_function(
        "(h) => Array.from(document.querySelectorAll('[data-testid=stVegaLiteChart]'))"
        ".some(c => c.querySelector('canvas, svg') && c.getBoundingClientRect().height > h)",
        arg=min_height,
        timeout=60_000,
    )


def _shoot_everywhere(browser, url: str, name: str, *, chart: bool = True, last: str | None = None) -> None:
    """Full-page screenshots of `url` at 1024 and 1400 px wide, in light and dark mode, once its
    chart is drawn (`chart`) or else its first table is, and the button named `last` (the page's end) is there."""
    for scheme in ("light", "dark"):
        # Tall, since Streamlit scrolls inside its own container and a full-page shot stops at the viewport.
        context = browser.new_context(viewport={"width": 1024, "height": 2400}, color_scheme=scheme)
        shot = context.new_page()
        shot.set_default_timeout(120_000)
        try:
            for width in (1024, 1400):
                shot.set_viewport_size({"width": width, "height": 2400})
                shot.goto(url)
                shot.locator("h1").first.wait_for()
                if chart:
                    _wait_chart_drawn(shot)
                else:
                    shot.locator("[data-testid=stDataFrame] canvas").first.wait_for()
                if last:
                    shot.get_by_role("button", name=last).wait_for()
                assert shot.locator("[data-testid=stException]").count() == 0
                shot.screenshot(path=str(ARTIFACTS / f"{name}-{width}-{scheme}.png"), full_page=True)
        finally:
            context.close()


KILL_CAUSE = (
    "killed (SIGKILL) by the kernel OOM killer in the job's memory cgroup: limit 1.00 GiB reached (cgroup oom_kill "
    "count 1); last sample at 3.9 s: stage load, tensor 40 of 96 (transformer_blocks.39.attn.to_q.weight), "
    "VmRSS 1.08 GiB, MemAvailable 19.2 GiB"
)
"""How the supervisor words an OOM kill in a memory cgroup (jobs/supervisor.py)."""
INTERNAL_NAMES = ("DESIGN", "UX.md", "STYLE.md")
"""Documents of the people who build Drainboard, which its users never have."""


def _add_killed_job(data: Path) -> int:
    """A retain load OOM-killed in a 1 GiB cgroup at tensor 40 of 96, recorded as the supervisor records one."""
    from storage.connections import connect
    from tests.dashboard.conftest import add_job, make_samples

    db = connect(data / "drainboard.db")
    try:
        samples = make_samples().iloc[:40]
        return add_job(db, status="killed", mode="retain", model=str(data / "models" / "tiny"), signal="SIGKILL",
                       error=KILL_CAUSE, memory_limit=2**30,
                       samples=samples.assign(cgroup_usage=samples["vm_rss"]))
    finally:
        db.conn.close()


def _assert_no_internal_names(page) -> None:
    text = page.locator("body").inner_text()
    for name in INTERNAL_NAMES:
        assert name not in text, f"{name} shown on {page.url}"


def test_a_killed_job_says_why_offers_edit_and_requeue_and_can_be_deleted(dashboard, page):
    base, data = dashboard
    page.goto(base + "/")  # the first visit prepares the database (when this test runs alone)
    page.get_by_text("Run a job").wait_for()
    job_id = _add_killed_job(data)
    page.goto(f"{base}/job?job={job_id}")
    banner = page.locator("[data-testid=stAlert]").filter(has_text="Killed (SIGKILL) by the OOM killer")
    banner.wait_for()
    _wait_chart_drawn(page, 300)
    _shot(page, "6-killed-job")
    assert banner.get_by_text("retry with a limit of", exact=False).is_visible()  # the next step, in the banner
    assert page.get_by_text("limit 1.00 GiB reached", exact=False).first.is_visible()  # the detail, opened below it
    assert page.get_by_text("tensor 40 of 96", exact=False).first.is_visible()
    _assert_no_internal_names(page)
    _shoot_everywhere(page.context.browser, f"{base}/job?job={job_id}", "6-killed-job", last="Events (JSONL)")

    page.get_by_role("button", name="Edit and re-queue").click()
    page.wait_for_url(f"**/?from={job_id}")

    page.goto(f"{base}/history?status=Killed")
    grid = page.locator("[data-testid=stDataFrame]").first
    grid.wait_for()
    _assert_no_internal_names(page)
    delete = page.get_by_role("button", name="Delete (1)")
    box = grid.bounding_box()
    # The row's selection box: the first column of the first row (the grid draws on a canvas).
    page.mouse.click(box["x"] + 18, box["y"] + 35 + 17)
    delete.wait_for()
    delete.click()
    page.get_by_role("button", name="Delete for good").click()
    page.get_by_text("Deleted 1 job(s)").wait_for()
    _shot(page, "7-history-deleted")
    assert not (data / "artifacts" / str(job_id)).exists()
    for name in ("run", "system", "compare"):
        page.goto(f"{base}/{'' if name == 'run' else name}")
        page.locator("h1").first.wait_for()
        _assert_no_internal_names(page)
