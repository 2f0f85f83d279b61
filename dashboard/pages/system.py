"""System: the box itself: memory pool, devices and the policy's answer, the worker, storage sizes."""

import time

import altair as alt
import pandas as pd
import psutil
import streamlit as st

from dashboard import charts, data
from dashboard import format as fmt
from dashboard.host import memory_kind, pool_caption, read_host_memory
from dashboard.views.jobs import describe_supervisor
from dashboard.views.run import offload_preview
from loader.offload import OffloadSettings

HISTORY_KEY = "system_history"  # session key: (time, in use, available) readings, last 15 minutes
HISTORY_SECONDS = 15 * 60

config = data.config()
db = data.db_path()
st.title("System")


@st.fragment(run_every=5)
def live_memory() -> None:
    host = read_host_memory()
    now = time.time()
    history = [r for r in st.session_state.get(HISTORY_KEY, []) if now - r[0] <= HISTORY_SECONDS]
    history.append((now, host.in_use, host.available))
    st.session_state[HISTORY_KEY] = history

    st.subheader("Memory pool")
    st.caption(f"This machine's {pool_caption(data.devices())}; a CPU job uses it directly.")
    st.altair_chart(charts.pool_bar(host.in_use, host.cached, host.total), width="stretch")
    cards = st.columns(4)
    cards[0].metric("In use (MemTotal − MemAvailable)", fmt.gib(host.in_use), border=True)
    cards[1].metric("MemAvailable", fmt.gib(host.available), border=True)
    cards[2].metric("Page cache", fmt.gib(host.cached), border=True)
    cards[3].metric("Swap used", fmt.gib(host.swap_used), border=True)
    frame = pd.DataFrame(history, columns=["time", "in_use", "available"])
    frame["time"] = pd.to_datetime(frame["time"], unit="s")
    frame["System in use"] = frame["in_use"] / fmt.GIB
    st.altair_chart(
        alt.Chart(frame)
        .mark_line(color=charts.SERIES[0].color, strokeWidth=2.5, point=len(frame) < 3)
        .encode(
            x=alt.X("time:T", title="this session, last 15 min"),
            y=alt.Y("System in use:Q", title="GiB in use", scale=alt.Scale(domain=[0, host.total / fmt.GIB])),
            tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), alt.Tooltip("System in use:Q", format=".2f")],
        )
        .properties(height=160),
        width="stretch",
    )


live_memory()

st.subheader("Devices and the offload policy")
for device in data.devices():
    with st.container(border=True):
        st.markdown(
            f"**{device.spec}** — {device.name} · "
            + (f"{fmt.gib(device.total_memory)}" if device.total_memory else "memory size unknown")
            + f" · {memory_kind(device)} (source: {device.source})"
        )
        st.caption(device.reason)
        st.dataframe(offload_preview(OffloadSettings(), device), hide_index=True, width="stretch")

st.subheader("Worker")
status = data.supervisor(db)
if status["alive"]:
    st.success(f"Supervisor {describe_supervisor(status)}; heartbeat {fmt.duration(status['heartbeat_age'])} ago.")
else:
    st.error("The supervisor is not running: queued jobs will wait. Start it here, or run `python -m jobs worker`.")
    if st.button("Start supervisor", type="primary"):
        from jobs.supervisor import ensure_supervisor

        with st.spinner("Starting the supervisor…"):
            ensure_supervisor(config)
        data.supervisor.clear()
        st.rerun()

rows = []
for pid, role in ((status.get("pid"), "supervisor"),):
    if pid and psutil.pid_exists(pid):
        proc = psutil.Process(pid)
        rows.append({"pid": pid, "role": role, "name": proc.name(), "RSS": fmt.gib(proc.memory_info().rss, 2), "age": fmt.duration(time.time() - proc.create_time())})
        for child in proc.children(recursive=True):
            rows.append({"pid": child.pid, "role": "job child", "name": child.name(), "RSS": fmt.gib(child.memory_info().rss, 2), "age": fmt.duration(time.time() - child.create_time())})
if rows:
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")

st.subheader("Storage")
cols = st.columns(3)
db_bytes = sum(p.stat().st_size for p in config.data_dir.glob("drainboard.db*") if p.is_file())
cols[0].metric("Database", fmt.gib(db_bytes, 2), border=True, help=str(config.db_path))
cols[1].metric("Artifacts", fmt.gib(data.folder_size(config.artifacts_dir), 2), border=True, help=str(config.artifacts_dir))
cols[2].metric("Jobs", f"{len(data.jobs(db)):,}", border=True)
st.caption("Model roots: " + ", ".join(f"`{r}`" for r in config.model_roots) + f" · data folder `{config.data_dir}`")
