"""The verdict and the memory guard agree at the wall, in a real browser (Chromium via Playwright, `streamlit run
app.py`): a load the Run page calls fitting under a memory budget runs to its end without the guard stopping it,
and one it calls not fitting is refused until *Queue anyway* is ticked. Loads of the tiny checkpoint keep it short:
the first one gives this machine the history of a job's own process that the verdict counts."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from core.sizes import format_size

from tests.dashboard.test_browser import _queue, _shot, _wait_done, browser, dashboard, page  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NEEDS = re.compile(r"needs ([\d.]+) (KiB|MiB|GiB)")
UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
MARGIN = 2 * 2**30
"""Room the fitting budget leaves the test box's other processes (the guard counts the whole machine's growth)."""


def _verdict(page, mib: int) -> str:
    """Type a budget of `mib` MiB into the Run page and return the fit panel's line for it, once redrawn."""
    field = page.get_by_role("textbox", name="Memory budget (guard)")
    field.fill(f"{mib}MiB")
    field.press("Enter")
    line = page.locator("[data-testid=stAlert]").filter(has_text=re.compile(r"^(Fits|Tight|Will not fit)")).filter(
        has_text=f"the {format_size(mib * 2**20)} budget")
    expect(line).to_have_count(1, timeout=30_000)
    return line.inner_text()


def _run_page(page, base: str) -> None:
    """The Run page with the tiny checkpoint and a load chosen."""
    page.goto(base + "/")
    page.get_by_text("Run a job").wait_for()
    page.locator("[data-testid=stSelectbox]").filter(has_text="Checkpoint").click()
    page.get_by_role("option").filter(has_text="tiny").click()
    page.get_by_text("Components of tiny").wait_for()
    choice = page.get_by_role("radio", name="load", exact=True).first
    if choice.get_attribute("aria-checked") != "true":
        choice.click()
    expect(choice).to_be_checked()


def _need(line: str) -> int:
    value, unit = NEEDS.search(line).groups()
    return int(float(value) * UNITS[unit])


def test_a_load_the_page_calls_fitting_is_not_stopped_and_one_it_does_not_is_refused_unless_forced(dashboard, page):
    base, data = dashboard
    first = _queue(page, base, "load")  # no budget: this machine's first load, whose process the verdict learns
    _wait_done(page, first, "verdict-1-history")

    _run_page(page, base)
    need = _need(_verdict(page, 4096))
    # The guard watches the whole machine's memory: on a shared test box other processes grow it too, so the
    # fitting budget leaves them room; the refused one sits just under the need, at the wall.
    fits = _verdict(page, (need + MARGIN) // 2**20 + 1)
    assert fits.startswith(("Fits: needs ", "Tight: needs ")), fits
    _shot(page, "verdict-2-fits")
    page.get_by_role("button", name="Queue job").click()
    page.wait_for_url("**/job?job=*")
    _wait_done(page, int(page.url.rsplit("=", 1)[1]), "verdict-3-ran")  # "Done in": the guard did not stop it
    assert page.get_by_text("memory guard").count() == 0

    _run_page(page, base)
    need = _need(_verdict(page, 4095))  # the job that ran is history now (another budget: no cached verdict)
    refused = _verdict(page, max(int(need * 0.95) // 2**20, 1))  # the page rounds the need it shows
    assert refused.startswith("Will not fit: needs ") and refused.endswith("or tick Queue anyway."), refused
    _shot(page, "verdict-4-refused")
    page.get_by_role("button", name="Queue job").click()
    page.get_by_text("Nothing was queued").wait_for()
    assert "job?job=" not in page.url
    page.locator("[data-testid=stCheckbox]").filter(has_text="Queue anyway").click()
    page.get_by_role("button", name="Queue job").click()
    page.wait_for_url("**/job?job=*")
    _shot(page, "verdict-5-forced")
