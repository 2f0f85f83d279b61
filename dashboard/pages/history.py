"""History: every job with its key metrics; select several to compare."""

import streamlit as st

from dashboard import data, nav
from dashboard.host import read_host_memory
from dashboard.views.history import FILTERS, history_frame, job_summary
from dashboard.views.spec import spec_mode

st.title("History")
db = data.db_path()
mem_total = read_host_memory().total
all_jobs = data.jobs(db)

if not all_jobs:
    st.info("No jobs yet. Queue one on the Run page: the defaults load the demo checkpoint in a few seconds.")
    if st.button("Go to Run", type="primary"):
        nav.goto("run")
    st.stop()

status_tab = st.segmented_control("Show", list(FILTERS), default="All", key="history_filter")
left, right = st.columns(2)
modes = sorted({spec_mode(j) for j in all_jobs if spec_mode(j)})
mode_pick = left.multiselect("Mode", modes, placeholder="any mode")
kinds = sorted({j["kind"] for j in all_jobs})
kind_pick = right.multiselect("Kind", kinds, placeholder="any kind")

statuses = FILTERS.get(status_tab or "All")
shown = [
    j
    for j in all_jobs
    if (statuses is None or j["status"] in statuses)
    and (not mode_pick or spec_mode(j) in mode_pick)
    and (not kind_pick or j["kind"] in kind_pick)
]
summaries = {
    j["id"]: job_summary(data.series(db, j["id"], data.sample_count(db, j["id"]), max_points=60), mem_total)
    for j in shown
}
table = history_frame(shown, summaries, link=lambda job_id: nav.link("job", job=str(job_id)))

event = st.dataframe(
    table,
    hide_index=True,
    width="stretch",
    on_select="rerun",
    selection_mode="multi-row",
    key="history_table",
    column_config={
        "": st.column_config.TextColumn("", width="small"),
        "job": st.column_config.LinkColumn("job", display_text=r"/job\?job=(\d+)", width="small"),
        "id": None,
        "started": st.column_config.DatetimeColumn("started", format="YYYY-MM-DD HH:mm:ss"),
        "duration (s)": st.column_config.NumberColumn(format="%.1f"),
        "peak in use (GiB)": st.column_config.NumberColumn(format="%.1f"),
        "footprint ×": st.column_config.ProgressColumn(
            "footprint ×", format="%.2f×", min_value=0.0, max_value=2.5, help="footprint_ratio (1.0× is the model itself)"
        ),
        "min headroom (GiB)": st.column_config.NumberColumn(format="%.1f"),
        "in use": st.column_config.LineChartColumn("in use (GiB)", width="small"),
    },
)
picked = [int(table.iloc[i]["id"]) for i in event.selection.rows]
st.caption(f"{len(shown)} of {len(all_jobs)} jobs. Select rows to compare them.")
if st.button(f"Compare ({len(picked)})", disabled=len(picked) < 2, type="primary"):
    nav.goto("compare", jobs=",".join(str(i) for i in sorted(picked)))
