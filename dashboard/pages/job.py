"""Job: one job live (charts refresh in a fragment), then its metrics, video and downloads."""

import json

import streamlit as st

from dashboard import charts, data, nav
from dashboard import format as fmt
from dashboard.host import memory_kind, read_host_memory
from dashboard.views import jobs as jv
from dashboard.views.spec import spec_checkpoint_name, spec_of
from jobs.queue import JobStateError, cancel, enqueue
from jobs.spec import JobSpecError, build_spec
from storage.connections import connect

LIVE_EVERY = 1.0  # seconds between live refreshes of the charts and cards
LIVE_KEY = "job_live"  # session key: id of the job whose live timer runs (cleared once it is final)
X_LABELS = {"placed": "bytes", "% placed": "percent", "seconds": "seconds"}
Y_LABELS = {"Above baseline": "baseline", "Fit data": "data", "Whole pool": "pool"}

db = data.db_path()
host = read_host_memory()


def _job_id() -> int | None:
    raw = st.query_params.get("job", "")
    if raw.isdigit():
        return int(raw)
    latest = data.jobs(db, limit=1)
    return latest[0]["id"] if latest else None


job_id = _job_id()
if job_id is None:
    st.title("Job")
    st.info("No jobs yet. Queue one on the Run page.")
    if st.button("Go to Run", type="primary"):
        nav.goto("run")
    st.stop()
job = data.job(db, job_id)
if job is None:
    st.title("Job")
    st.error(f"There is no job {job_id}.")
    st.stop()
st.query_params["job"] = str(job_id)

spec = spec_of(job)
device = data.device_info(spec.get("device", "cpu"))
capacity = device.total_memory or host.total
total_bytes = (job.get("metrics") or {}).get("bytes_placed") or data.expected_bytes(job)
live = not jv.is_final(job)

st.title(f"Job {job_id}")
st.caption(
    " · ".join(
        str(part)
        for part in (
            job["kind"],
            spec.get("mode"),
            spec_checkpoint_name(job),
            f"{spec.get('device')} ({memory_kind(device)})",
            spec.get("dtype") or "checkpoint dtype",
            fmt.gib(total_bytes) + " to place" if total_bytes else None,
        )
        if part
    )
)

placed_unit = fmt.size_unit(total_bytes)[0]
controls = st.columns([2, 3, 1, 1])
x_choice = controls[0].segmented_control(
    "x axis",
    list(X_LABELS),
    default="seconds" if job["kind"] != "load" else "placed",
    format_func=lambda label: f"{placed_unit} placed" if label == "placed" else label,
    key="job_x",
) or "placed"
# A load's own cost is small next to the process and the machine at demo scale: show it above the baseline.
default_fit = "Above baseline" if job["kind"] == "load" else "Fit data"
fit = controls[1].segmented_control(
    "y axis",
    list(Y_LABELS),
    default=default_fit,
    key="job_fit",
    help="Above baseline: each series minus its first sample, so the curves show what this job added "
    "(on the placed axis the dotted diagonal is the model itself, 1.0×). Fit data and Whole pool show absolute use.",
) or default_fit
paused = controls[2].toggle("Pause live updates", value=False, disabled=not live, key="job_pause")
if live and controls[3].button("Cancel job", type="secondary"):
    try:
        now = cancel(connect(db, ensure=False), job_id)
        st.toast(f"Job {job_id}: {'cancelled' if now == 'cancelled' else 'cancel requested'}")
    except JobStateError as e:
        st.warning(str(e))
    data.job.clear()
    st.rerun()


def draw_body(job_id: int, x: str, fit: str) -> None:
    """Status, metric cards, chart and side panel; runs inside the live fragment while the job runs."""
    job = data.job(db, job_id)
    if jv.is_final(job) and st.session_state.get(LIVE_KEY) == job_id:
        st.session_state.pop(LIVE_KEY)
        st.rerun(scope="app")
    count = data.sample_count(db, job_id)
    samples = data.series(db, job_id, count)
    events = data.events(db, job_id)
    stats = jv.live_stats(samples, host.total)

    label = jv.status_label(job, stats, total_bytes)
    state = jv.status_state(job["status"])
    if job["status"] == "running" and not stats.samples and job.get("started_at"):
        waited = (events["created_at"].max() if len(events) else job["started_at"]) - job["started_at"]
        if waited > 60:
            st.warning("No memory samples after 60 s: check the supervisor on the System page.")
    with st.status(label, state=state, expanded=False):
        st.dataframe(jv.event_table(events, last=20), hide_index=True, width="stretch")

    previous = next(
        (
            j
            for j in data.jobs(db, status=("succeeded",), limit=50)
            if j["id"] < job_id and spec_of(j).get("mode") == spec.get("mode") and j["kind"] == job["kind"]
        ),
        None,
    )
    cards = jv.metric_cards(job, stats, total_bytes=total_bytes, capacity=capacity, previous=previous, events=events)
    spark = (host.total - samples["mem_available"]).iloc[:: max(1, len(samples) // 50)] / fmt.GIB if len(samples) else None
    for column, card in zip(st.columns(len(cards)), cards):
        column.metric(
            card.label,
            card.value,
            delta=card.delta,
            delta_color=card.delta_color,
            help=card.help,
            border=True,
            chart_data=spark.tolist() if card.label == "Peak system in use" and spark is not None else None,
            chart_type="area",
        )

    left, right = st.columns([3, 2])
    with left:
        x_mode = X_LABELS[x]
        if x_mode == "percent" and not total_bytes:
            x_mode = "bytes"
        chart = charts.memory_chart(
            samples,
            x=x_mode,
            total_bytes=total_bytes,
            mem_total=host.total,
            capacity=capacity,
            fit=Y_LABELS[fit],
            events=events[["t", "kind", "message"]] if len(events) else None,
            killed=job["status"] == "killed",
        )
        st.altair_chart(chart, width="stretch", key=f"memory_chart_{job_id}")
        st.caption(
            f"{count:,} samples" + (f", drawn as {len(samples):,} points (each bucket's min and max kept)" if count > len(samples) else "")
            + (". Above baseline: each series minus its first sample" if fit == "Above baseline" else "")
            + ". Sources: System in use = MemTotal − MemAvailable (/proc/meminfo); VmRSS and RssFile from the worker's /proc status; GPU allocated from the torch allocator."
        )
    with right:
        if not jv.is_final(job):
            draw_progress(job, stats)
        else:
            draw_outcome(job_id, job)


def draw_progress(job: dict, stats: jv.LiveStats) -> None:
    st.subheader(job.get("stage") or "starting")
    done, total = job.get("progress_done"), job.get("progress_total")
    if total:
        st.progress(min(1.0, (done or 0) / total), text=f"{job.get('stage') or 'step'} {done or 0}/{total}")
    elif job["status"] == "queued":
        st.info("Waiting for the worker to pick this job up.")
    if stats.samples == 0:
        st.info("Starting worker, importing, opening checkpoint…")
    st.dataframe(jv.event_table(data.events(db, job["id"]), last=8), hide_index=True, width="stretch")


def draw_outcome(job_id: int, job: dict) -> None:
    videos = [a for a in data.artifacts(db, job_id) if a["name"].endswith(".mp4")]
    if videos:
        st.video(str(data.artifact_path(job_id, videos[0]["name"])), loop=True, muted=True, autoplay=True)
    elif job["kind"] != "load":
        st.info(f"No video: the job {job['status']} before it wrote one.")
    if job["status"] != "succeeded":
        st.error(jv.status_label(job, jv.live_stats(data.series(db, job_id, data.sample_count(db, job_id)), host.total), total_bytes))
        st.caption("Last sample")
        st.dataframe(jv.last_sample_table(data.last_sample(db, job_id), host.total), hide_index=True, width="stretch")
    table = jv.metrics_table(job.get("metrics"))
    if len(table):
        st.dataframe(table, hide_index=True, width="stretch", column_config={"name": st.column_config.TextColumn("DESIGN name")})


if live and not paused:
    st.session_state[LIVE_KEY] = job_id
    st.fragment(draw_body, run_every=LIVE_EVERY)(job_id, x_choice, fit)
else:
    draw_body(job_id, x_choice, fit)

if jv.is_final(job):
    if job["status"] != "succeeded":
        st.subheader("Retry")
        modes = ["same settings"] + [m for m in ("stream", "drain") if m != spec.get("mode")]
        retry_cols = st.columns(len(modes))
        for column, choice in zip(retry_cols, modes):
            if column.button(f"Retry with {choice}", key=f"retry_{choice}"):
                raw = {**spec, **({} if choice == "same settings" else {"mode": choice})}
                try:
                    new_id = enqueue(connect(db, ensure=False), build_spec(raw, data.config()), retry_of=job_id)
                except JobSpecError as e:
                    st.error(str(e))
                else:
                    data.jobs.clear()
                    st.toast(f"Queued job {new_id}")
                    nav.goto("job", job=str(new_id))

    st.subheader("Downloads")
    downloads = st.columns(3)
    for column, artifact in zip(downloads, [a for a in data.artifacts(db, job_id) if a["name"].endswith(".mp4")][:1]):
        path = data.artifact_path(job_id, artifact["name"])
        column.download_button(
            f"Video (MP4, {fmt.gib(artifact['size'], 2)})",
            data=path.read_bytes,
            file_name=f"drainboard-job{job_id}.mp4",
            mime="video/mp4",
            on_click="ignore",
            icon=":material/movie:",
        )
    downloads[1].download_button(
        "Samples (CSV)",
        data=lambda: data.samples_csv(db, job_id),
        file_name=f"drainboard-job{job_id}-samples.csv",
        mime="text/csv",
        on_click="ignore",
        icon=":material/table:",
    )
    downloads[2].download_button(
        "Events (JSONL)",
        data=lambda: "".join(json.dumps(row, default=str) + "\n" for row in data.events(db, job_id).to_dict("records")),
        file_name=f"drainboard-job{job_id}-events.jsonl",
        mime="application/jsonl",
        on_click="ignore",
        icon=":material/list:",
    )
