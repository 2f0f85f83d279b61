"""In a real browser (Debian's Chromium via Playwright, as test_browser.py): one job set's footprint reads the
same number on the Job page, in Compare and in History, and those pages and System are shot at 1024 and 1400 px,
light and dark (the Run page's shots are test_browser_run.py's).

The jobs are recorded as the supervisor records finished loads, with samples whose own growth would give a
different ratio than the recorded one: the pages must all quote the load report's footprint_ratio.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.dashboard.test_browser import (  # noqa: F401  (pytest fixtures)
    ARTIFACTS, _shoot_everywhere, _wait_chart_drawn, browser, dashboard, page,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FOOTPRINTS = {"stream": 1.07, "drain": 1.42, "retain": 2.15}
"""The recorded footprint of each job (the load report's footprint_ratio)."""


def _add_loads(data: Path) -> dict[str, int]:
    from storage.connections import connect
    from tests.dashboard.conftest import add_job, make_samples

    db = connect(data / "drainboard.db")
    try:
        return {
            mode: add_job(db, status="succeeded", mode=mode, model=str(data / "models" / "tiny"), samples=make_samples(),
                          metrics={"bytes_placed": 2 * 2**30, "footprint_ratio": ratio, "load_seconds": 3.0})
            for mode, ratio in FOOTPRINTS.items()
        }
    finally:
        db.conn.close()


def _grid_text(page) -> str:
    """The cells a data grid shows (glide draws on a canvas and mirrors the visible cells in an accessible table)."""
    grid = page.locator("[data-testid=stDataFrame]").first
    grid.wait_for()
    page.wait_for_function(
        "() => document.querySelector('[data-testid=stDataFrame] table td, [data-testid=stDataFrame] [role=gridcell]')")
    return " ".join(grid.locator("td, [role=gridcell]").all_inner_texts())


def test_the_footprint_is_one_number_on_job_compare_and_history(dashboard, page):
    base, data = dashboard
    page.goto(base + "/")  # the first visit prepares the data folder and its database
    page.get_by_text("Run a job").wait_for()
    ids = _add_loads(data)
    for mode, job_id in ids.items():
        page.goto(f"{base}/job?job={job_id}")
        card = page.locator("[data-testid=stMetric]").filter(has_text="Footprint ratio")
        card.wait_for()
        assert card.locator("[data-testid=stMetricValue]").inner_text().strip() == f"{FOOTPRINTS[mode]:.2f}×"

    page.goto(f"{base}/compare?jobs={','.join(map(str, ids.values()))}")
    page.get_by_text("Reference job").wait_for()
    _wait_chart_drawn(page)
    table = page.locator("[data-testid=stDataFrame]").last
    table.wait_for()
    page.wait_for_function("() => document.querySelectorAll('[data-testid=stDataFrame] td, [data-testid=stDataFrame] [role=gridcell]').length > 0")
    compared = " ".join(table.locator("td, [role=gridcell]").all_inner_texts())
    for ratio in FOOTPRINTS.values():
        assert f"{ratio:.2f}×" in compared, compared

    page.goto(f"{base}/history")
    history = _grid_text(page)
    page.screenshot(path=str(ARTIFACTS / "8-history-grid.png"))
    for ratio in FOOTPRINTS.values():  # the accessible mirror carries the cell's value; the canvas draws it with "×"
        assert re.search(rf"(?<![\d.]){ratio:.2f}(?![\d])", history), history
    assert not re.search(r"\bNone\b", history), history

    for name, url, chart in (("job", f"/job?job={ids['drain']}", True), ("compare", f"/compare?jobs={','.join(map(str, ids.values()))}", True),
                             ("history", "/history", False), ("system", "/system", True)):
        _shoot_everywhere(page.context.browser, base + url, f"8-{name}", chart=chart)
