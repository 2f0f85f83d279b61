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


FOCUS_JS = """() => {
  const e = document.activeElement;
  if (!e || e === document.body) return null;
  const box = e.getBoundingClientRect();
  const style = getComputedStyle(e);
  const field = e.closest('[data-testid]');
  return {tag: e.tagName, text: (e.innerText || e.getAttribute('aria-label') || e.value || '').trim().slice(0, 40),
          where: field ? field.getAttribute('data-testid') : '', visible: box.width > 0 && box.height > 0
          && style.visibility !== 'hidden' && !!e.offsetParent, top: box.top + window.scrollY};
}"""
"""What has the keyboard focus: its tag, text, nearest Streamlit element, whether a sighted user sees it."""
TAB_STOPS = 90
"""Tab presses allowed before *Queue job*: the nav, the form's fields, the verdict, then the button."""


@pytest.mark.parametrize("kind", ["load", "load + generate"])
def test_queue_job_is_reached_by_tab_after_the_form_with_no_hidden_stop_on_the_way(dashboard, browser, kind):  # noqa: F811
    base, _ = dashboard
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(120_000)
    try:
        page.goto(base + "/")
        _pick(page, "Checkpoint", "tiny")
        page.get_by_text("headers valid").first.wait_for()
        choice = page.get_by_role("radio", name=kind, exact=True).first
        if choice.get_attribute("aria-checked") != "true":
            choice.click()
        # The form is mirrored in the URL once the click's run is over: wait for it, or a reload loses the kind.
        page.wait_for_url(lambda url: ("kind=generate" in url) == (kind != "load"))
        _settled(page)
        _queue_button(page, disabled=False)
        # A fresh load of the same form (the URL keeps it), so Tab starts at the top, not at the last click.
        page.reload()
        page.get_by_text("headers valid").first.wait_for()
        _settled(page)
        _queue_button(page, disabled=False)
        assert page.get_by_role("radio", name=kind, exact=True).first.get_attribute("aria-checked") == "true"
        stops = []
        for _ in range(TAB_STOPS):
            page.keyboard.press("Tab")
            focused = page.evaluate(FOCUS_JS)
            stops.append(focused)
            if focused and focused["tag"] == "BUTTON" and "Queue job" in focused["text"]:
                break
        described = [f"{s['where']}:{s['text']}" if s else "body" for s in stops]
        assert stops[-1] and "Queue job" in stops[-1]["text"], described
        # Every stop on the way is one a sighted keyboard user sees (Streamlit's skip link shows itself on focus).
        hidden = [f"{s['where']}:{s['text']}" for s in stops if s and not s["visible"] and s["where"] != "stSkipToContent"]
        assert hidden == [], hidden
        print(f"{kind}: Queue job is Tab stop {len(stops)}: {described}")
        wheres = [s["where"] for s in stops if s]
        # The form in its reading order: checkpoint, job kind, mode, device, then the limits, then Queue job.
        first = {name: next(i for i, w in enumerate(wheres) if w == name)
                 for name in ("stSelectbox", "stButtonGroup", "stTextInputField")}
        assert first["stSelectbox"] < first["stButtonGroup"] < first["stTextInputField"] < len(wheres) - 1, described
        assert "stHeaderActionElements" not in wheres, described  # no heading links between the form and the button
        page.keyboard.press("Enter")
        page.wait_for_url("**/job?job=*")  # the button Tab reached is the one that queues
    finally:
        page.screenshot(path=str(ARTIFACTS / f"run-tab-order-{kind.replace(' + ', '-')}.png"))
        context.close()
