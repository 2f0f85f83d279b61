"""What every page shares: the product line, the bind check, first-start preparation,
the queue chip and the memory bar.

`draw_header` needs nothing but Streamlit, so app.py draws it before importing the
rest (the loader pulls in torch, seconds on a cold start): a visitor sees the product
and what is happening at once, never a blank page. The other functions import the
data layer when they run.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager, suppress
from typing import Iterator

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

PRODUCT = "Drainboard"
TAGLINE = "load and run huge video models on one memory-tight box, and see what every byte costs"
"""The one-line description under the product name on every page."""

PREPARED_KEY = "_drainboard_prepared"
"""Session flag: this session has checked the data folder, demo checkpoint and supervisor."""

LIVE_EVERY = 2
"""Seconds between refreshes of the queue chip and memory bar (and of the Run page's queue,
which must read the same as the chip)."""


PAGE_CSS = """<style>
[data-testid="stTopNavLink"]:focus-visible { outline: 3px solid #0072B2; outline-offset: 2px; border-radius: 4px; }
[data-testid="stElementToolbar"] { visibility: hidden; }
[data-testid="stElementContainer"]:hover [data-testid="stElementToolbar"] { visibility: visible; }
[data-testid="stCaptionContainer"] { opacity: 0.85; }
[data-testid="stTab"][aria-selected="true"], [data-testid="stTab"][aria-selected="true"] *,
button[data-variant="segmented_control"][aria-checked="true"],
button[data-variant="segmented_control"][aria-checked="true"] * { color: inherit !important; }
</style>"""
"""Keyboard use and contrast on every page, in both themes. A nav link in focus gets a ring that reads on both
(the primary blue, 3.6:1 on the dark background, 5.2:1 on white), and a chart's toolbar, invisible until hovered,
leaves the Tab order until then (hidden buttons put *Queue job* behind dozens of stops). Captions are drawn at
0.85 opacity of the text colour, not Streamlit's 0.6 (3.8:1 on the light theme); a selected tab or segment keeps
the text colour and shows its state by the primary underline, tint and border (the primary blue as text on the
dark background is 3.2-3.5:1). WCAG AA asks 4.5:1 for text; the figures are in .streamlit/config.toml."""


def draw_header() -> DeltaGenerator:
    """The product name and description; returns the slot beside them for the live chip and bar."""
    st.html(PAGE_CSS)
    name, live = st.columns([2, 3], vertical_alignment="center")
    name.markdown(f"**{PRODUCT}** — {TAGLINE}")
    return live


@contextmanager
def one_line_on_setup_error() -> Iterator[None]:
    """A bad setting or a refused job database (damaged, read-only, a directory, locked): the one line the CLIs
    print, in place of the page (no traceback)."""
    from core.plugins import PluginError
    from storage.config import ConfigError
    from storage.connections import DatabaseRefusedError, refusal_error

    try:
        yield
    except (ConfigError, PluginError, DatabaseRefusedError) as e:
        st.error(str(e), icon=":material/error:")
    except sqlite3.DatabaseError as e:
        from dashboard import data

        refused = refusal_error(e, data.db_path())
        if refused is None:
            raise
        st.error(str(refused), icon=":material/database:")


def refuse_open_bind() -> None:
    """Stop here, serving nothing, when bound beyond localhost without the configuration asking for it."""
    from dashboard import data
    from dashboard.bind import bind_refusal

    reason = bind_refusal(st.get_option("server.address"), data.config().address)
    if reason:
        st.error(reason, icon=":material/gpp_bad:")
        st.stop()


def prepare_once() -> None:
    """On a session's first run: create the data folder and database, write the demo
    checkpoint if it is missing (with progress), and start a supervisor if none is alive.
    A skeleton of what is happening stands in for the page meanwhile."""
    slot = st.empty()  # drawn on every run, so the page below keeps its place in the element tree
    if st.session_state.get(PREPARED_KEY):
        return
    from dashboard import data
    from dashboard.bootstrap import demo_missing, prepare

    config = data.config()
    if demo_missing(config):
        with slot.status("First start: writing the demo checkpoint…", expanded=True) as box:
            bar = st.progress(0.0, text="preparing the data folder")
            prepared = prepare(config, lambda fraction, text: bar.progress(min(1.0, max(0.0, fraction)), text=text))
            if prepared.demo_error:
                box.update(label="First start: the demo checkpoint could not be written", state="error")
                st.error(prepared.demo_error)
                return  # tried again on the next run, once space is freed
        slot.empty()
        st.toast(f"Ready: demo checkpoint written to {prepared.demo_path}", icon=":material/check_circle:")
    else:
        slot.caption("Opening the database and checking the job supervisor…")
        prepare(config)
        slot.empty()
    data.checkpoints.clear()
    data.supervisor.clear()
    st.session_state[PREPARED_KEY] = True


def draw_live(slot: DeltaGenerator) -> None:
    """The queue chip and the memory bar in `slot`, refreshed every LIVE_EVERY seconds on their own."""
    with slot:
        _live()


@st.fragment(run_every=LIVE_EVERY)
def _live() -> None:
    from dashboard import data
    from dashboard import format as fmt
    from dashboard.host import pool_caption, read_host_memory
    from dashboard.charts.style import readable
    from dashboard.charts.host import pool_bar
    from dashboard.views.jobs import queue_chip

    with suppress(OSError):  # a worker the dashboard started stays while a page is open (jobs.supervisor)
        data.config().dashboard_heartbeat.touch()
    host = read_host_memory()
    chip, bar = st.columns([2, 3], vertical_alignment="center")
    chip.markdown(f"**{queue_chip(data.active_jobs(data.db_path()))}**")
    with bar:
        st.altair_chart(readable(pool_bar(host, axis=False), st.context.theme.type), width="stretch")
        st.caption(
            f"System in use {fmt.gib(host.in_use)} of {fmt.gib(host.total)} · MemAvailable {fmt.gib(host.available)}"
            f" · MemFree {fmt.gib(host.free)} · page cache {fmt.gib(host.cached)} · {pool_caption(data.devices())}"
        )
