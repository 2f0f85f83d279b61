"""What every page shares: first-start preparation, the queue chip and the memory bar."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data
from dashboard.bootstrap import demo_missing, prepare
from dashboard import format as fmt
from dashboard.host import pool_caption, read_host_memory
from dashboard.views.jobs import queue_chip

PREPARED_KEY = "_drainboard_prepared"
"""Session flag: this session has checked the data folder, demo checkpoint and supervisor."""


def prepare_once() -> None:
    """On a session's first run: create the data folder and database, write the demo
    checkpoint if it is missing (with progress), and start a supervisor if none is alive."""
    if st.session_state.get(PREPARED_KEY):
        return
    config = data.config()
    if demo_missing(config):
        with st.status("First start: writing the demo checkpoint…", expanded=True) as box:
            bar = st.progress(0.0)
            prepared = prepare(config, lambda fraction, text: bar.progress(min(1.0, max(0.0, fraction)), text=text))
            if prepared.demo_error:
                box.update(label="First start: the demo checkpoint could not be written", state="error")
                st.error(prepared.demo_error)
                return  # tried again on the next run, once space is freed
            box.update(label=f"Ready: demo checkpoint written to {prepared.demo_path}", state="complete", expanded=False)
    else:
        prepare(config)
    data.checkpoints.clear()
    data.supervisor.clear()
    st.session_state[PREPARED_KEY] = True


@st.fragment(run_every=5)
def draw_frame() -> None:
    """Queue chip and unified-memory bar, refreshed every 5 s on their own."""
    host = read_host_memory()
    chip, bar = st.columns([2, 3], vertical_alignment="center")
    chip.markdown(f"**{queue_chip(data.jobs(data.db_path(), status=('running', 'queued')))}**")
    with bar:
        st.altair_chart(charts.pool_bar(host.in_use, host.cached, host.total, height=24, axis=False), width="stretch")
        st.caption(
            f"Memory in use {fmt.gib(host.in_use)} of {fmt.gib(host.total)} · page cache {fmt.gib(host.cached)}"
            f" · {pool_caption(data.devices())}"
        )
