"""The Models page in a real browser (Chromium via Playwright, `streamlit run app.py`): the tiny checkpoint listed
with its layout and fit, a second one picked, and *Open in Run* landing on the Run page with it chosen."""

from __future__ import annotations

import shutil

import pytest
from playwright.sync_api import expect

from tests.dashboard.test_browser import ARTIFACTS, browser, dashboard  # noqa: F401  (module fixtures)
from tests.dashboard.test_browser_run import _chosen, _page_bar, _settled

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _open_models_page(page, base: str):
    """The Models page from the app's first page, settled; its main column."""
    page.goto(base + "/")
    page.get_by_text("Run a job").wait_for()
    _settled(page)
    _page_bar(page, "Models")
    page.get_by_text("The fit weighs each checkpoint's weights at bf16").wait_for()
    _settled(page)
    return page.locator("[data-testid=stMain]")


def test_the_models_page_lists_the_checkpoints_and_opens_run_with_the_one_picked(dashboard, browser):  # noqa: F811
    base, data = dashboard
    shutil.copytree(data / "models" / "tiny", data / "models" / "tiny-copy")
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(120_000)
    try:
        main = _open_models_page(page, base)
        expect(main.get_by_text("tiny-copy · diffusers folder · fits")).to_be_visible()
        expect(main.get_by_text("tiny · diffusers folder · fits", exact=True)).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "models-page.png"), full_page=True)
        page.get_by_role("button", name="Open in Run").last.click()  # name order: demo (the app's own), tiny, tiny-copy
        page.get_by_text("Run a job").wait_for()
        _settled(page)
        assert _chosen(page, "Checkpoint").startswith("tiny-copy")
        page.get_by_text("Components of tiny-copy").wait_for()
    finally:
        page.screenshot(path=str(ARTIFACTS / "models-open-in-run.png"), full_page=True)
        context.close()


def test_a_gguf_file_is_listed_with_its_quant_types_and_opens_run_as_the_generate_s_transformer(
        dashboard, browser):  # noqa: F811
    from tests.loader.gguf_files import gguf_bytes

    base, data = dashboard
    dit = data / "models" / "dit-Q8_0.gguf"
    dit.write_bytes(gguf_bytes([("blocks.0.attn.qkv_proj.weight", (96, 32), "Q8_0"),
                                ("blocks.0.norm.weight", (32,), "F32")]))
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(120_000)
    try:
        main = _open_models_page(page, base)
        expect(main.get_by_text("dit-Q8_0.gguf · GGUF file · fits")).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "models-page-gguf.png"), full_page=True)
        page.get_by_role("button", name="Open in Run").nth(1).click()  # name order: demo, dit-Q8_0.gguf, tiny...
        page.get_by_text("Run a job").wait_for()
        _settled(page)
        field = page.get_by_role("textbox", name="Single-file transformer (optional)")
        field.wait_for()  # the generate form is long: it can take longer than expect's own wait to draw
        expect(field).to_have_value(str(dit))
    finally:
        page.screenshot(path=str(ARTIFACTS / "models-open-gguf-in-run.png"), full_page=True)
        context.close()
