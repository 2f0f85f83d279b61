"""The page list and moving between pages.

Pages are plain scripts so each runs standalone (AppTest loads one page at a
time); `app.py` registers them with `st.navigation`. `goto` switches page when
the router is running, and otherwise (a standalone page, as in tests) records
where it would have gone in the query parameters and session state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import streamlit as st

ROOT = Path(__file__).resolve().parent.parent
"""The folder app.py lives in; page paths are relative to it."""

ROUTER_KEY = "_drainboard_router"
"""Session-state flag set by app.py, so pages know st.switch_page is available."""

NAVIGATED_KEY = "navigated_to"
"""Session-state key where a standalone page records (page, query params) instead of switching."""


@dataclass(frozen=True)
class PageDef:
    """One page of the dashboard."""

    name: str
    """Key used by `goto` (`run`, `job`, ...)."""
    title: str
    """Title in the navigation bar."""
    icon: str
    """Material icon shown next to the title."""

    @property
    def path(self) -> str:
        """Script path relative to app.py."""
        return f"dashboard/pages/{self.name}.py"


PAGES: tuple[PageDef, ...] = (
    PageDef("run", "Run", ":material/play_arrow:"),
    PageDef("job", "Job", ":material/monitoring:"),
    PageDef("history", "History", ":material/history:"),
    PageDef("compare", "Compare", ":material/compare_arrows:"),
    PageDef("models", "Models", ":material/inventory_2:"),
    PageDef("system", "System", ":material/memory:"),
)
"""Every page, in the order of the page bar (one flat bar: six pages need no sections)."""

_BY_NAME = {p.name: p for p in PAGES}
DEFAULT_PAGE = "run"
"""The page at `/` (a default page has no URL path of its own)."""


def st_page(page: PageDef) -> st.Page:
    """The st.Page for a page definition (url path = its name, so links read `/job?job=3`)."""
    return st.Page(str(ROOT / page.path), title=page.title, icon=page.icon, url_path=page.name, default=page.name == DEFAULT_PAGE)


def goto(name: str, **query_params: str) -> None:
    """Switch to page `name` with `query_params` (e.g. goto("job", job="7"))."""
    page = _BY_NAME[name]
    if st.session_state.get(ROUTER_KEY):
        st.switch_page(st_page(page), query_params=query_params)
    st.session_state[NAVIGATED_KEY] = (name, dict(query_params))
    st.query_params.from_dict(query_params)
    st.rerun()


def link(name: str, **query_params: str) -> str:
    """A relative URL to a page, for LinkColumn and markdown links."""
    query = "&".join(f"{k}={v}" for k, v in query_params.items())
    path = "/" if name == DEFAULT_PAGE else f"/{name}"
    return path + (f"?{query}" if query else "")
