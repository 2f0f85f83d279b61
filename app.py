"""Drainboard's Streamlit entry point: draw the product line, check the address, prepare
the box once, draw the live frame, route.

    streamlit run app.py        (binds 127.0.0.1 by its .streamlit/config.toml; see dashboard/bind.py)
"""

from loader.process import configure_process

configure_process()  # before the pages import anything of diffusers' or transformers'

import streamlit as st  # noqa: E402

from dashboard import frame, nav  # noqa: E402

st.set_page_config(page_title="Drainboard", page_icon=":material/water_drop:", layout="wide")
st.session_state[nav.ROUTER_KEY] = True
router = st.navigation([nav.st_page(page) for page in nav.PAGES], position="top")
live_slot = frame.draw_header()
with frame.one_line_on_setup_error():
    frame.refuse_open_bind()
    frame.prepare_once()
    frame.draw_live(live_slot)
    router.run()
