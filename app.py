"""Drainboard's Streamlit entry point: prepare the box once, draw the frame, route.

    streamlit run app.py        (binds 127.0.0.1; see .streamlit/config.toml and DRAINBOARD_ADDRESS)
"""

import streamlit as st

from dashboard import nav
from dashboard.frame import draw_frame, prepare_once

st.set_page_config(page_title="Drainboard", page_icon=":material/water_drop:", layout="wide")
st.session_state[nav.ROUTER_KEY] = True
sections: dict[str, list] = {}
for page in nav.PAGES:
    sections.setdefault(page.section, []).append(nav.st_page(page))
router = st.navigation(sections, position="top")
prepare_once()
draw_frame()
router.run()
