"""The Run and System pages and the frame in a real browser (Chromium via Playwright, `streamlit run app.py`):
first impression, the loader's verdict on a broken checkpoint, a form that survives a trip to another page,
edit and re-queue, no internal document names, and screenshots at 1024 and 1400 px, light and dark."""

from __future__ import annotations

import re
import shutil

import pytest

from tests.dashboard.test_browser import ARTIFACTS, browser, dashboard  # noqa: F401  (module fixtures)
from tests.dashboard.test_page_text import INTERNAL_NAME

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WIDTHS = (1024, 1400)
SCHEMES = ("light", "dark")


@pytest.fixture(scope="module")
def broken(dashboard):  # noqa: F811
    """A copy of the tiny checkpoint with its transformer shard cut short, under the model root."""
    _, data = dashboard
    target = data / "models" / "broken"
    shutil.copytree(data / "models" / "tiny", target)
    shard = sorted((target / "transformer").glob("*.safetensors"))[0]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 1000)
    return target


def _settled(page) -> None:
    """Wait until the script run is over: no "running" widget, no stale (greyed) elements."""
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=stStatusWidget]')"
        " && document.querySelectorAll('[data-stale=true]').length === 0",
        timeout=120_000,
    )


def _pick(page, label: str, option: str) -> None:
    page.locator("[data-testid=stSelectbox]").filter(has_text=label).click()
    page.get_by_role("option").filter(has_text=option).first.click()
    _settled(page)


def _page_bar(page, title: str) -> None:
    """Click a page in the top page bar (each link's text is its icon's name, then its title)."""
    page.locator("[data-testid=stTopNavLink]").filter(has_text=re.compile(f"{title}$")).click()


def _queue_button(page, *, disabled: bool):
    """The visible Queue job button, once it is in the expected state (a disabled button with help
    text has a hidden twin for its tooltip)."""
    from playwright.sync_api import expect

    button = page.locator("button:visible", has_text="Queue job")
    if disabled:
        expect(button).to_be_disabled(timeout=120_000)
    else:
        expect(button).to_be_enabled(timeout=120_000)
    return button


def _chosen(page, label: str) -> str:
    """What a selectbox shows as chosen (kept in its input's value)."""
    return page.locator("[data-testid=stSelectbox]").filter(has_text=label).locator("input").input_value()


def _no_internal_names(page, where: str) -> None:
    text = page.locator("[data-testid=stMain]").inner_text()
    assert INTERNAL_NAME.findall(text) == [], where


def test_run_page_first_impression_validation_memory_and_requeue(dashboard, broken, browser):  # noqa: F811
    base, _ = dashboard
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1024, "height": 900})
    page = context.new_page()
    page.set_default_timeout(120_000)
    try:
        page.goto(base + "/")
        # The product line is there before the first start is done (never a blank page).
        page.get_by_text("Drainboard", exact=True).first.wait_for()
        page.get_by_text("Run a job").wait_for()
        _settled(page)
        # Queue job above the fold at 1024 x 900.
        box = _queue_button(page, disabled=False).bounding_box()
        assert box is not None and box["y"] + box["height"] < 900, box

        # A truncated shard: the loader's message in red, nothing can be queued.
        _pick(page, "Checkpoint", "broken")
        page.get_by_text("The loader refuses").wait_for()
        error = page.locator("[data-testid=stAlertContentError]").first.inner_text()
        assert "is truncated" in error and "copy it again" in error  # the per-tensor lines folded into one
        _queue_button(page, disabled=True)
        page.screenshot(path=str(ARTIFACTS / "run-broken-checkpoint.png"))

        # Choices survive a trip to another page and back.
        _pick(page, "Checkpoint", "tiny")
        page.get_by_text("headers valid").first.wait_for()
        page.get_by_role("radio", name="drain", exact=True).click()
        page.get_by_text("drain: builds the dict").wait_for()
        _settled(page)
        _page_bar(page, "System")
        page.get_by_text("Memory pool").wait_for()
        _page_bar(page, "Run")
        page.get_by_text("Run a job").wait_for()
        _settled(page)
        assert _chosen(page, "Checkpoint").startswith("tiny — ")
        assert page.get_by_role("radio", name="drain", exact=True).is_checked()

        # Queue it, then edit and re-queue from the job: the form comes back filled.
        _queue_button(page, disabled=False).click()
        page.wait_for_url("**/job?job=*")
        job_id = int(page.url.rsplit("=", 1)[1])
        page.goto(f"{base}/?from={job_id}")
        page.get_by_text(f"Filled from job {job_id}").wait_for()
        _settled(page)
        assert page.get_by_role("radio", name="drain", exact=True).is_checked()
        assert _chosen(page, "Checkpoint").startswith("tiny — ")

        for path in ("/", "/system", "/history", f"/compare?jobs={job_id}"):
            page.goto(base + path)
            page.locator("[data-testid=stMain] h1").first.wait_for()
            _settled(page)
            _no_internal_names(page, path)
    finally:
        page.screenshot(path=str(ARTIFACTS / "run-last-step.png"))
        context.close()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("width", WIDTHS)
def test_run_and_system_pages_render_at_each_width_and_scheme(dashboard, browser, width, scheme):  # noqa: F811
    """Screenshots to look at; the asserts catch what a look would: an exception, clipped or missing charts."""
    base, _ = dashboard
    context = browser.new_context(viewport={"width": width, "height": 1400}, color_scheme=scheme)
    page = context.new_page()
    page.set_default_timeout(120_000)
    try:
        for name, path, ready in (("run", "/", "button:visible:has-text('Queue job')"),
                                  ("system", "/system", "[data-testid=stMetricValue]:has-text('GiB')")):
            page.goto(base + path)
            page.locator(ready).first.wait_for()
            page.locator("[data-testid=stVegaLiteChart] canvas, [data-testid=stVegaLiteChart] svg").first.wait_for()
            _settled(page)
            assert page.locator("[data-testid=stException]").count() == 0
            page.screenshot(path=str(ARTIFACTS / f"{name}-{width}-{scheme}.png"), full_page=True)
    finally:
        context.close()
