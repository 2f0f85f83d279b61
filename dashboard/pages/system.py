"""System: the box itself: the memory pool as the kernel sees it (in use, page cache, MemFree,
MemAvailable, pressure), devices and the policy's answer, the worker, storage sizes."""

from __future__ import annotations

import time

import pandas as pd
import psutil
import streamlit as st

from dashboard import data
from dashboard import format as fmt
from dashboard.host import HostMemory, Pressure, cuda_free_note, is_unified, memory_kind, pool_caption, read_host_memory, read_pressure
from dashboard.charts.host import memory_history, pool_bar, pressure_history
from dashboard.views.jobs import describe_supervisor
from dashboard.views.ray_cluster import ray_cluster_view
from dashboard.views.run import offload_preview
from dashboard.charts.style import readable
from machine.offload import OffloadSettings

# (Comments, not docstrings: Streamlit would draw a page script's bare strings.)
HISTORY_KEY = "system_history"  # session key: this session's readings, the last HISTORY_SECONDS of them
HISTORY_SECONDS = 15 * 60
REFRESH = 5  # seconds between readings


def remember(host: HostMemory, pressure: Pressure | None) -> pd.DataFrame:
    """Add this reading to the session's history and return the last 15 minutes: the samples jobs stored
    (System in use and MemAvailable) and this page's own readings (which add MemFree and pressure)."""
    now = time.time()
    history = [r for r in st.session_state.get(HISTORY_KEY, []) if now - r["time"] <= HISTORY_SECONDS]
    history.append({
        "time": now, "in_use": host.in_use, "available": host.available, "free": host.free,
        "some": pressure.some_avg10 if pressure else None, "full": pressure.full_avg10 if pressure else None,
    })
    st.session_state[HISTORY_KEY] = history
    stored = data.host_history(data.db_path(), now - HISTORY_SECONDS)
    stored = stored.assign(in_use=host.total - stored["available"], free=None, some=None, full=None)
    return pd.concat([stored, pd.DataFrame(history)], ignore_index=True).sort_values("time").reset_index(drop=True)


def memory_cards(host: HostMemory) -> None:
    cards = st.columns(5)
    cards[0].metric("System in use", fmt.gib(host.in_use), border=True, help="MemTotal − MemAvailable: the pressure on the pool.")
    cards[1].metric("MemAvailable", fmt.gib(host.available), border=True, help="What can still be allocated without swapping: MemFree plus reclaimable cache.")
    cards[2].metric("MemFree", fmt.gib(host.free), border=True, help="Pages nobody uses, not even the page cache.")
    cards[3].metric("Page cache", fmt.gib(host.cached), border=True, help="Cached in /proc/meminfo: file pages, checkpoint shards among them; most of it is reclaimable.")
    cards[4].metric("Swap used", fmt.gib(host.swap_used), border=True)


@st.fragment(run_every=REFRESH)
def live_memory() -> None:
    host = read_host_memory()
    pressure = read_pressure()
    history = remember(host, pressure)
    devices = data.devices()
    st.subheader("Memory pool")
    st.caption(f"This machine's {pool_caption(devices)} ({fmt.gib(host.total)}); a CPU job uses it directly.")
    st.altair_chart(readable(pool_bar(host), st.context.theme.type), width="stretch")
    memory_cards(host)
    if is_unified(devices):
        st.info(cuda_free_note(host), icon=":material/info:")
    st.altair_chart(readable(memory_history(history, host.total), st.context.theme.type), width="stretch")
    st.subheader("Memory pressure")
    if pressure is None:
        st.caption("This kernel does not report memory pressure (/proc/pressure/memory is missing: no PSI).")
        return
    st.caption(
        f"From /proc/pressure/memory: in the last 10 s some task waited for memory {pressure.some_avg10:.2f}% of the time,"
        f" every task at once {pressure.full_avg10:.2f}% (60 s: {pressure.some_avg60:.2f}% / {pressure.full_avg60:.2f}%)."
        " Sustained 'all tasks' stalls mean the box is thrashing, often just before an OOM kill or a freeze."
    )
    st.altair_chart(readable(pressure_history(history[["time", "some", "full"]].dropna()), st.context.theme.type),
                    width="stretch")


def devices_section() -> None:
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


def _process_row(proc: psutil.Process, role: str) -> dict:
    return {"pid": proc.pid, "role": role, "name": proc.name(), "RSS": fmt.gib(proc.memory_info().rss, 2),
            "age": fmt.duration(time.time() - proc.create_time())}


def worker_section(db: str) -> None:
    st.subheader("Worker")
    status = data.supervisor(db)
    notice = data.lock_notice(db)
    if notice is not None:
        st.warning(f"The job database has been locked by another process for {fmt.duration(time.time() - notice.since)} "
                   f"(since {time.strftime('%H:%M:%S', time.localtime(notice.since))}): the worker ({notice.owner}) "
                   f"waits and retries its writes, and loses none. Whatever holds the lock (a transaction left open "
                   f"in another program, a long write) must end it; the job then gets an event saying how long.",
                   icon=":material/lock_clock:")
    if status["alive"]:
        st.success(f"Supervisor {describe_supervisor(status)}; heartbeat {fmt.duration(status['heartbeat_age'])} ago.")
    else:
        st.error("The supervisor is not running: queued jobs will wait. Start it here, or run `python -m jobs worker`.")
        if st.button("Start supervisor", type="primary"):
            from jobs.presence import ensure_supervisor

            with st.spinner("Starting the supervisor…"):
                ensure_supervisor(data.config())
            data.supervisor.clear()
            st.rerun()
    pid = status.get("pid")
    if not pid or not psutil.pid_exists(pid):
        return
    try:
        proc = psutil.Process(pid)
        rows = [_process_row(proc, "supervisor")] + [_process_row(c, process_role(c, status)) for c in proc.children(recursive=True)]
    except psutil.Error:  # it exited between the check and the read
        return
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    st.caption("The fork server lives as long as its supervisor: it holds the imports every job needs, so a job "
               "starts in a fraction of a second, and it forks each job's child. Both stop when the supervisor does.")


def process_role(proc: psutil.Process, status: dict) -> str:
    """What a process under the supervisor is: the fork server (there between jobs too) or a job's child."""
    if "jobs.forkserver" in " ".join(proc.cmdline()):
        return "fork server (waits between jobs)"
    job = status.get("current_job")
    return f"child of job {job}" if job else "job child"


def storage_section(db: str) -> None:
    config = data.config()
    st.subheader("Storage")
    cols = st.columns(3)
    db_bytes = sum(p.stat().st_size for p in config.data_dir.glob("drainboard.db*") if p.is_file())
    cols[0].metric("Database", fmt.gib(db_bytes, 2), border=True, help=str(config.db_path))
    cols[1].metric("Artifacts", fmt.gib(data.folder_size(config.artifacts_dir), 2), border=True, help=str(config.artifacts_dir))
    cols[2].metric("Jobs", f"{len(data.jobs(db)):,}", border=True)
    st.caption("Model roots: " + ", ".join(f"`{r}`" for r in config.model_roots) + f" · data folder `{config.data_dir}`")


def ray_cluster_section() -> None:
    """The Ray section: nothing without a Ray address, one warning when the cluster does not answer."""
    view = ray_cluster_view(data.config())
    if view is None:
        return
    st.subheader("Ray cluster")
    st.caption(view.caption)
    if view.problem is not None:
        st.warning(view.problem, icon=":material/cloud_off:")
        return
    st.dataframe(view.nodes, hide_index=True, width="stretch")


def main() -> None:
    db = data.db_path()
    st.title("System")
    live_memory()
    devices_section()
    worker_section(db)
    ray_cluster_section()
    storage_section(db)


main()
