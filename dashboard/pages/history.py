"""History: every job with its parameters and key metrics; filter, search, compare or delete them.

The status chip, mode, kind and search are bound to the URL (`?status=Failed&q=demo`),
so a filtered view can be shared and survives a refresh.
"""

import time

import streamlit as st

from dashboard import data, nav
from dashboard import format as fmt
from dashboard.host import read_host_memory
from dashboard.thumbnails import job_inputs
from dashboard.views.history import FILTERS, INPUT_COLUMNS, history_frame, job_summary, status_tint
from storage.connections import connect
from storage.queries import delete_job
from storage.schema import FINAL_STATUSES

PENDING_KEY = "history_delete"  # session key: ids waiting for the user to confirm their deletion
DONE_KEY = "history_deleted"  # session key: what the last delete removed, said once after the rerun

db = data.db_path()
mem_total = read_host_memory().total


PAGE_SIZE = 100  # jobs per page of the table: every job is reachable through the page picker


def filters() -> tuple[dict, int]:
    """The chips, pickers and search; returns the database filter they set (for data.job_page) and how many jobs
    pass it. Counts are over every job, never over one page."""
    # The URL carries the chip's label, so counts go in the caption, not the label (links stay valid).
    chip = st.segmented_control("Show", list(FILTERS), default="All", key="status", bind="query-params") or "All"
    caption = st.empty()  # the counts follow the pickers below, so they are written once those are read
    left, middle, right = st.columns([1, 1, 2])
    kinds, modes = data.job_choices(db)
    mode_pick = left.multiselect("Mode", modes, placeholder="any mode", key="mode", bind="query-params")
    kind_pick = middle.multiselect("Kind", kinds, placeholder="any kind", key="kind", bind="query-params")
    search = right.text_input("Search checkpoint or prompt", key="q", bind="query-params", placeholder="e.g. demo, fox")
    wanted = {"kinds": tuple(kind_pick) or None, "modes": tuple(mode_pick) or None, "about": (search or "").strip()}
    counts = data.job_counts(db, **wanted)
    caption.caption(" · ".join(f"{counts[s]:,} {name.lower()}" for name, statuses in FILTERS.items() if statuses
                               for s in statuses if counts.get(s)))
    statuses = FILTERS[chip]
    return {"status": statuses, **wanted}, sum(n for s, n in counts.items() if statuses is None or s in statuses)


def page_of(matching: int) -> int:
    """The page picker under the table (only when there is more than one page); the 0-based page shown."""
    pages = max(1, -(-matching // PAGE_SIZE))
    if pages == 1:
        return 0
    page = st.number_input(f"Page (of {pages:,})", min_value=1, max_value=pages, value=1, step=1, key="history_page",
                           width=160)
    return int(page) - 1


# How History's numeric columns read (the values stay numeric, so they sort). A comment, not a docstring:
# Streamlit would draw a page script's bare string. Streamlit draws an empty number cell as "None" whatever the
# Styler says, so a figure a job does not have is stored as -inf (sorting below every real one) and reads "—".
NUMBER_FORMATS = {
    "duration": "{:.1f} s".format, "footprint ×": "{:.2f}×".format,
    **{size: lambda gib: fmt.gib(gib * fmt.GIB, 2) for size in ("peak in use", "peak footprint", "min headroom")},
}


def shown_number(show):
    """A Styler formatter: the figure as `show` writes it (sizes by the one size formatter, MiB under 1 GiB),
    or "—" for the -inf that stands for none."""
    return lambda value: fmt.MISSING if value == float("-inf") else show(value)


def table(shown: list[dict]):
    """The jobs table with a multi-row selection; returns the frame and the selected ids."""
    summaries = {
        j["id"]: job_summary(data.series(db, j["id"], data.sample_count(db, j["id"]), max_points=60), mem_total)
        for j in shown
    }
    inputs = {j["id"]: job_inputs(db, j["id"], tuple(INPUT_COLUMNS)) for j in shown if j["kind"] == "generate"}
    frame = history_frame(shown, summaries, link=lambda job_id: nav.link("job", job=str(job_id)), inputs=inputs,
                          now=time.time())
    if frame.empty:
        st.info("No job matches these filters and search.", icon=":material/search_off:")
        return frame, []
    # Numbers stay numbers (they sort); what a cell shows comes from the Styler, so a missing one reads "—", not None.
    frame[list(NUMBER_FORMATS)] = frame[list(NUMBER_FORMATS)].astype(float).fillna(float("-inf"))
    shown_as = frame.style.format({c: shown_number(f) for c, f in NUMBER_FORMATS.items()}).map(status_tint,
                                                                                               subset=["status"])
    event = st.dataframe(
        shown_as,
        hide_index=True,
        width="stretch",
        on_select="rerun",
        selection_mode="multi-row",
        key="history_table",
        column_config={
            "status": st.column_config.TextColumn("status", width=110),
            "job": st.column_config.LinkColumn("job", display_text=r"/job\?job=(\d+)", width="small"),
            "id": None,
            "outcome": st.column_config.TextColumn("outcome", width="large"),
            "prompt": st.column_config.TextColumn("prompt", width="medium"),
            "started": st.column_config.DatetimeColumn("started", format="YYYY-MM-DD HH:mm:ss"),
            "duration": st.column_config.NumberColumn("duration", width="small"),
            "peak in use": st.column_config.NumberColumn("peak in use", width="small",
                                                         help="peak system in use (MemTotal − MemAvailable)"),
            "peak footprint": st.column_config.NumberColumn(
                "peak footprint", width="small",
                help="the job's own peak: VmRSS + GPU allocated (a generate's peak_footprint, the Job page's card)"),
            "footprint ×": st.column_config.NumberColumn(
                "footprint ×", width="small",
                help="footprint ratio: the job's own memory growth over the bytes it placed (1.0× is the model itself); "
                "the load report's footprint_ratio, the number the Job page and Compare show",
            ),
            "min headroom": st.column_config.NumberColumn("min headroom", width="small"),
            "in use": st.column_config.LineChartColumn("in use (GiB)", width="small"),
            **{heading: st.column_config.ImageColumn(heading, width="small", help=f"the job's own copy of its {heading}")
               for heading in INPUT_COLUMNS.values()},
            "retry of": st.column_config.LinkColumn("retry of", display_text=r"/job\?job=(\d+)", width="small"),
        },
    )
    # A selection outlives the rows it was made on (a filter or a delete changes them): drop stale rows.
    return frame, [int(frame.iloc[i]["id"]) for i in event.selection.rows if i < len(frame)]


def delete(picked: list[dict]) -> None:
    """Delete with a confirmation; jobs that may still run are refused and named."""
    busy = [j["id"] for j in picked if j["status"] not in FINAL_STATUSES]
    pending = st.session_state.get(PENDING_KEY)
    if pending is None:
        if busy:
            st.caption(f"Job {', '.join(map(str, busy))} is still queued or running: cancel it before deleting.")
        return
    files = sum(a["size"] for i in pending for a in data.artifacts(db, i))
    samples = sum(data.sample_count(db, i) for i in pending)
    st.warning(f"Delete job {', '.join(map(str, pending))}? This removes {samples:,} samples and {fmt.gib(files)} of files "
               "(videos, logs) for good.")
    yes, no, _ = st.columns([1, 1, 4])
    if yes.button("Delete for good", type="primary", key="history_confirm_delete"):
        conn = connect(db)
        reclaimed = sum(delete_job(conn, data.config().data_dir, i) for i in pending)
        st.session_state[DONE_KEY] = f"Deleted {len(pending)} job(s): {fmt.gib(reclaimed)} of files and {samples:,} samples reclaimed."
        st.session_state.pop(PENDING_KEY)
        st.session_state.pop("history_table", None)
        for loader in (data.jobs, data.job_page, data.job_counts, data.job_choices, data.job, data.artifacts,
                       data.sample_count):
            loader.clear()
        st.rerun()
    if no.button("Keep them", key="history_keep"):
        st.session_state.pop(PENDING_KEY)
        st.rerun()


def main() -> None:
    st.title("History")
    if DONE_KEY in st.session_state:
        st.success(st.session_state.pop(DONE_KEY))
    if not data.job_counts(db):
        st.info("No jobs yet. Queue one on the Run page: the defaults load the demo checkpoint in a few seconds.")
        if st.button("Go to Run", type="primary"):
            nav.goto("run")
        st.stop()
    wanted, matching = filters()
    slot = st.container()
    page = page_of(matching)
    shown = data.job_page(db, **wanted, limit=PAGE_SIZE, offset=page * PAGE_SIZE)
    with slot:
        _, picked = table(shown)
    total = sum(data.job_counts(db).values())
    first = page * PAGE_SIZE + 1
    st.caption((f"Jobs {first:,}–{first + len(shown) - 1:,} of {matching:,} matching" if matching > len(shown)
                else f"{matching:,} matching") + f" ({total:,} in all). Select rows to compare or delete them.")
    by_id = {j["id"]: j for j in shown}
    chosen = [by_id[i] for i in picked if i in by_id]
    left, right, _ = st.columns([1, 1, 4])
    if left.button(f"Compare ({len(picked)})", disabled=len(picked) < 2, type="primary", key="history_compare"):
        nav.goto("compare", jobs=",".join(str(i) for i in sorted(picked)))
    finished = [j["id"] for j in chosen if j["status"] in FINAL_STATUSES]
    if right.button(f"Delete ({len(finished)})", disabled=not finished, key="history_delete_button", icon=":material/delete:"):
        st.session_state[PENDING_KEY] = finished
    delete(chosen)


main()
