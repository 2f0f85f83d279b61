"""Job: one job live (charts refresh in a fragment), then why it ended, its parameters, metrics, video and downloads."""

import functools
import json
import time

import pandas as pd
import streamlit as st

from dashboard import charts, data, nav
from dashboard import format as fmt
from dashboard import words
from dashboard.host import memory_kind, read_host_memory
from dashboard.views import eta as ev
from dashboard.inputs_panel import input_strip, output_videos
from dashboard.views import cards as cv
from dashboard.views import job_tables as tv
from dashboard.views import jobs as jv
from dashboard.views import outcome as oc
from dashboard.views.downloads import log_offer, log_tail
from dashboard.views.query import QueryError, job_id as parse_job_id
from dashboard.views.spec import generate_parameters, job_parameters, spec_checkpoint_name, spec_of
from dashboard.charts.style import readable
from jobs.queue import JobStateError, cancel, retry
from jobs.spec import JobSpecError
from storage.connections import connect

LIVE_EVERY = 1.0  # seconds between live refreshes of the charts and cards
LIVE_KEY = "job_live"  # session key: id of the job whose live timer runs (cleared once it is final)
X_LABELS = {"placed": "bytes", "% placed": "percent", "seconds": "seconds"}
Y_LABELS = {"Above baseline": "baseline", "Fit data": "data", "Whole pool": "pool"}
SHORT_DETAIL = 3  # a cause of at most this many lines opens with the page

db = data.db_path()
host = read_host_memory()


def chosen_job() -> dict:
    """The job the URL names (or the newest); stops the page with a message otherwise."""
    raw = st.query_params.get("job", "")
    try:
        wanted = parse_job_id(raw) if raw else None
    except QueryError as e:
        st.title("Job")
        st.error(str(e))
        st.stop()
    if wanted is None:
        latest = data.jobs(db, limit=1)
        wanted = latest[0]["id"] if latest else None
    if wanted is None:
        st.title("Job")
        st.info("No jobs yet. Queue one on the Run page.")
        if st.button("Go to Run", type="primary"):
            nav.goto("run")
        st.stop()
    job = data.job(db, wanted)
    if job is None:
        st.title("Job")
        st.error(f"There is no job {wanted}.")
        st.stop()
    st.query_params["job"] = str(wanted)
    return job


def job_sizes(job: dict) -> tuple[int | None, int | None]:
    """(bytes the job places, capacity of its device's memory). A total its own samples have
    passed is not the job's (the checkpoint changed since): None then, rather than "280000% placed"."""
    device = data.device_info(spec_of(job).get("device", "cpu"))
    total = (job.get("metrics") or {}).get("bytes_placed") or data.expected_bytes(job)
    placed = (data.last_sample(db, job["id"]) or {}).get("bytes_placed") or 0
    return (total if total and placed <= total else None), device.total_memory or host.total


def draw_header(job: dict, total_bytes: int | None) -> None:
    spec = spec_of(job)
    device = data.device_info(spec.get("device", "cpu"))
    st.title(f"Job {job['id']}")
    parts = (
        job["kind"],
        spec.get("mode"),
        spec_checkpoint_name(job),
        f"{spec.get('device')} ({memory_kind(device)})",
        spec.get("dtype") or "checkpoint dtype",
        fmt.gib(total_bytes) + " to place" if total_bytes else None,
    )
    st.caption(" · ".join(str(part) for part in parts if part))
    asked = generate_parameters(job)
    if asked:
        steps = (spec.get("generate") or {}).get("steps")
        st.markdown(f"**Prompt:** {asked['prompt']}  \n**Seed** {asked['seed']} · **frames** {asked['frames']} · "
                    f"**size** {asked['size']} · **{words.steps(steps)}** · **shift** {asked['shift']}  \n**Workflow** {asked['workflow']} "
                    f"(input images: {asked['input images']}) · **VAE tiling** {asked['VAE tiling']} · "
                    f"**VAE precision** {asked['VAE precision']} · **transformer weights** {asked['transformer weights']}")
    draw_lineage(job)
    forced = oc.forced_note(job)
    if forced:
        st.warning(forced, icon=":material/priority_high:")


def draw_lineage(job: dict) -> None:
    """Links between a retry and its original, both ways."""
    links = []
    if job.get("retry_of"):
        links.append(f"retry of [job {job['retry_of']}]({nav.link('job', job=str(job['retry_of']))})")
    retries = [j["id"] for j in data.jobs(db) if j.get("retry_of") == job["id"]]
    if retries:
        links.append("retried as " + ", ".join(f"[job {i}]({nav.link('job', job=str(i))})" for i in sorted(retries)))
    if links:
        st.markdown(" · ".join(links).capitalize())


def job_outcome(job: dict, total_bytes: int | None) -> oc.Outcome:
    samples = data.series(db, job["id"], data.sample_count(db, job["id"]))
    stats = jv.live_stats(samples, host.total)
    return oc.outcome(job, stats, total_bytes, samples=samples, predicted=oc.predicted_peak(job, data.events(db, job["id"])))


def draw_outcome(told: oc.Outcome) -> None:
    """Why a finished job ended, at the top of its page: one plain sentence and what to do next."""
    draw = {"success": st.success, "info": st.info, "warning": st.warning}.get(told.tone, st.error)
    draw("\n\n".join([f"**{told.headline}**", *([told.next_step] if told.next_step else [])]))


def draw_outcome_details(job: dict, told: oc.Outcome) -> None:
    """The whole cause (every line, in plain words, folded), under the chart and video: one click away."""
    details = [line for line in told.cause if line not in told.headline]
    if details:
        with st.expander("What happened, in detail", expanded=len(details) <= SHORT_DETAIL):
            for line in details:
                st.markdown(f"- {line}")
            recorded = "What the job recorded" if job["status"] == "cancelled" else "The error exactly as the job recorded it"
            st.caption(f"{recorded}: `python -m jobs show --json` or the Events download.")


def draw_actions(job: dict, live: bool) -> None:
    """Cancel while it runs; edit-and-re-queue always (the Run form, pre-filled from this job)."""
    row = st.container(horizontal=True, horizontal_alignment="right")
    if row.button("Edit and re-queue", key="job_edit", icon=":material/edit:",
                  help="Open the Run form filled in with this job's parameters"):
        nav.goto("run", **{"from": str(job["id"])})
    if live and row.button("Cancel job", type="secondary", key="job_cancel"):
        try:
            now = cancel(connect(db), job["id"])
            st.toast(f"Job {job['id']}: {'cancelled' if now == 'cancelled' else 'cancel requested'}")
        except JobStateError as e:
            st.warning(str(e))
        data.job.clear()
        st.rerun()


def draw_controls(job: dict, total_bytes: int | None, live: bool) -> tuple[str, str, bool]:
    """The chart's x and y views and the live pause toggle. A generate job places its components
    stage by stage, so it has only the seconds view (a placed axis would stay empty)."""
    placed_unit = fmt.size_unit(total_bytes or (data.last_sample(db, job["id"]) or {}).get("bytes_placed"))[0]
    x_options = list(X_LABELS) if job["kind"] == "load" else ["seconds"]
    controls = st.columns([4, 4, 3], vertical_alignment="bottom")
    x_choice = controls[0].segmented_control(
        "x axis",
        x_options,
        default="placed" if job["kind"] == "load" else "seconds",
        format_func=lambda label: f"{placed_unit} placed" if label == "placed" else label,
        key="job_x",
    ) or x_options[0]
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
    with controls[2]:
        paused = live and st.toggle("Pause live updates", value=False, key="job_pause")
        draw_actions(job, live)
    return x_choice, fit, paused


def draw_body(job_id: int, x: str, fit: str) -> None:
    """Status, metric cards, chart and side panel from one read of the job; runs inside the live fragment while it runs."""
    job = data.job(db, job_id)
    if jv.is_final(job) and st.session_state.get(LIVE_KEY) == job_id:
        st.session_state.pop(LIVE_KEY)
        data.jobs.clear()  # the header's queue chip reads the job list: it must not still say "running"
        st.rerun(scope="app")
    total_bytes, capacity = job_sizes(job)
    count = data.sample_count(db, job_id)
    samples = data.series(db, job_id, count)
    events = data.events(db, job_id)
    stats = jv.live_stats(samples, host.total)
    if not jv.is_final(job):
        draw_status(job, stats, events, total_bytes)
    draw_cards(job, stats, samples, events, total_bytes, capacity)
    left, right = st.columns([3, 2])
    with left:
        draw_chart(job, samples, events, count, x, fit, total_bytes, capacity)
    with right:
        if jv.is_final(job):
            draw_video(job)
            if job["kind"] == "generate":
                draw_seconds_vs_forecast(job)
        else:
            draw_progress(job, stats, events)


def draw_status(job: dict, stats: jv.LiveStats, events, total_bytes: int | None) -> None:
    if job["status"] == "running" and not stats.samples and job.get("started_at"):
        waited = (events["created_at"].max() if len(events) else job["started_at"]) - job["started_at"]
        if waited > 60:
            st.warning("No memory samples after 60 s: check the supervisor on the System page.")
    label = jv.status_label(job, stats, total_bytes, stalled=jv.stalled_for(job, stats, events))
    with st.status(label, state=jv.status_state(job["status"]), expanded=False):
        st.dataframe(tv.event_table(events, last=20), hide_index=True, width="stretch")


def draw_cards(job: dict, stats: jv.LiveStats, samples, events, total_bytes: int | None, capacity: int | None) -> None:
    previous = cv.comparable_previous(job, data.jobs(db, status=("succeeded",), limit=200))
    cards = cv.metric_cards(job, stats, total_bytes=total_bytes, capacity=capacity, previous=previous, events=events)
    spark = (host.total - samples["mem_available"]).iloc[:: max(1, len(samples) // 50)] / fmt.GIB if len(samples) else None
    for column, card in zip(st.columns(len(cards)), cards):
        column.metric(
            card.label,
            card.value,
            delta=card.delta,
            delta_color=card.delta_color,
            delta_arrow=card.delta_arrow,
            help=card.help,
            border=True,
            chart_data=spark.tolist() if card.label == "Peak in use" and spark is not None else None,
            chart_type="area",
        )


def draw_chart(job: dict, samples, events, count: int, x: str, fit: str, total_bytes: int | None, capacity: int | None) -> None:
    if job["status"] == "queued":  # an empty axis would read as a chart of nothing
        st.caption("No memory samples yet: the chart starts when a worker starts the job.")
        return
    x_mode = X_LABELS[x]
    if x_mode == "percent" and not total_bytes:
        x_mode = "bytes"
    startup = jv.startup_text(samples) if job["kind"] == "load" else None
    if startup:  # a load's chart is what it placed: the process starting up is said apart, under the chart
        samples = charts.from_first_placement(samples)
    chart = charts.memory_chart(
        samples,
        x=x_mode,
        total_bytes=total_bytes,
        mem_total=host.total,
        capacity=capacity,
        fit=Y_LABELS[fit],
        events=events[["t", "kind", "message"]] if len(events) else None,
        killed=job["status"] == "killed",
        kill_label="memory guard" if jv.kill_kind(job) == "guard" else "process killed",
        kill_series=oc.kill_series(job),
        limits=oc.job_limits(job),
        predicted_peak=oc.predicted_peak(job, events),
        theme=st.context.theme.type or "light",
    )
    st.altair_chart(readable(chart, st.context.theme.type), width="stretch", key=f"memory_chart_{job['id']}")
    st.caption(
        f"{count:,} samples" + (f", drawn as {len(samples):,} points (each bucket's min and max kept)" if count > len(samples) else "")
        + (". Above baseline: each series minus its first sample" if fit == "Above baseline" else "")
        + ". Sources: System in use = MemTotal − MemAvailable (/proc/meminfo); VmRSS and RssFile from the worker's "
        "/proc status (RssFile is file-backed: mapped checkpoint pages the kernel can reclaim); GPU allocated from the "
        "torch allocator; cgroup usage is what a memory limit enforces."
        + (f" {startup}" if startup else "")
    )


def draw_progress(job: dict, stats: jv.LiveStats, events) -> None:
    if job["status"] == "queued":  # nothing has started: where it stands in the queue, not a stage
        st.subheader("Queued")
        place = jv.queue_places(data.active_jobs(db)).get(job["id"], "waiting for a worker")
        st.info(f"{place[:1].upper()}{place[1:]}.", icon=":material/schedule:")
        return
    where = jv.progress(job)
    st.subheader(words.stage(where.stage) if where.stage not in jv.STARTING_STAGES else "Starting")
    if where.fraction is not None:
        st.progress(where.fraction, text=where.text)
    draw_time_left(job, events, where.fraction)
    if stats.samples == 0 or job.get("stage") in jv.STARTING_STAGES:
        st.info(jv.starting_text(job))
    st.dataframe(tv.event_table(events, last=8), hide_index=True, width="stretch")


def draw_time_left(job: dict, events, fraction: float | None) -> None:
    """A generate's time left, from the seconds its forecast predicted at submit."""
    if job["kind"] != "generate" or job["status"] != "running":
        return
    done, current, elapsed = ev.stage_progress(events.to_dict("records"), time.time())
    share = fraction if current == "denoise.denoise" else None
    st.caption(ev.time_left_text(spec_of(job).get("forecast"), done, current, elapsed, share))


def draw_seconds_vs_forecast(job: dict) -> None:
    """At the end of a generate: predicted and measured seconds per stage."""
    took = job["finished_at"] - job["started_at"] if job.get("finished_at") and job.get("started_at") else None
    rows = ev.predicted_vs_measured(spec_of(job).get("forecast"), (job.get("metrics") or {}).get("stage_seconds") or {},
                                    took)
    if rows:
        st.subheader("Seconds: predicted vs measured")
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", key="job_seconds_vs_forecast")


def draw_video(job: dict) -> None:
    input_strip(data.artifacts(db, job["id"]), lambda name: data.artifact_path(job["id"], name))
    videos = output_videos(data.artifacts(db, job["id"]))
    if videos:
        st.video(str(data.artifact_path(job["id"], videos[0]["name"])), loop=True)
    elif job["kind"] != "load":
        st.info(f"No video: the job was {job['status']} before it wrote one.")
    if job["status"] != "succeeded":
        st.caption("Last sample")
        st.table(tv.last_sample_table(data.last_sample(db, job["id"]), host.total).set_index("field"))


def draw_details(job: dict) -> None:
    """Parameters, per-component load reports (generate), metrics and events, one tab each."""
    metrics = job.get("metrics") or {}
    reports = tv.load_reports_table(metrics)
    names = ["Parameters"] + (["Load reports"] if len(reports) else []) + ["Metrics", "Events"]
    tabs = dict(zip(names, st.tabs(names)))
    params = job_parameters(job)
    tabs["Parameters"].table(pd.DataFrame({"value": list(params.values())}, index=pd.Index(list(params), name="parameter")))
    if "Load reports" in tabs:
        tabs["Load reports"].dataframe(reports, hide_index=True, width="stretch", key="job_load_reports")
    table = tv.metrics_table(metrics)
    if len(table):
        tabs["Metrics"].dataframe(table, hide_index=True, width="stretch", key="job_metrics")
    else:
        tabs["Metrics"].caption("No metrics recorded (yet).")
    tabs["Events"].dataframe(tv.event_table(data.events(db, job["id"])), hide_index=True, width="stretch", key="job_events")


def draw_retry(job: dict, suggested: int | None) -> None:
    """Retry buttons that fit how the job ended (oc.retry_choices)."""
    choices = oc.retry_choices(job, suggested)
    if not choices:
        return
    st.subheader("Retry")
    row = st.container(horizontal=True)
    forced = "It is queued anyway (forced), as this job was." if spec_of(job).get("forced") else None
    for choice in choices:
        if row.button(f"Retry with {choice}", key=f"retry_{choice}", help=forced):
            changes = oc.retry_changes(choice, suggested)
            try:  # the one retry path: the stored spec is validated again, as the CLI's retry does
                new_id = retry(connect(db), job["id"], data.config(), changes=changes)
            except (JobSpecError, JobStateError) as e:
                st.error(str(e))
            else:
                data.jobs.clear()
                st.toast(f"Queued job {new_id}")
                nav.goto("job", job=str(new_id))


def draw_downloads(job_id: int) -> None:
    st.subheader("Downloads")
    artifacts = data.artifacts(db, job_id)
    files = [a for a in artifacts if a["name"].endswith((".mp4", ".log"))]
    row = st.container(horizontal=True)
    notes = []
    for artifact in files:
        path = data.artifact_path(job_id, artifact["name"])
        video = artifact["name"].endswith(".mp4")
        if video:
            label, offered = f"Video (MP4, {fmt.gib(artifact['size'], 1)})", path.read_bytes
        else:  # only its end: Streamlit holds what a download offers in memory (dashboard.views.downloads)
            label, note = log_offer(artifact["name"], artifact["size"], path)
            offered = functools.partial(log_tail, path)
            notes += [note] if note else []
        row.download_button(
            label,
            data=offered,
            file_name=f"drainboard-job{job_id}-{artifact['name']}",
            mime=artifact["media_type"],
            on_click="ignore",
            icon=":material/movie:" if video else ":material/description:",
            key=f"download_{artifact['name']}",
        )
    row.download_button(
        "Samples (CSV)",
        data=lambda: data.samples_csv(db, job_id),
        file_name=f"drainboard-job{job_id}-samples.csv",
        mime="text/csv",
        on_click="ignore",
        icon=":material/table:",
    )
    row.download_button(
        "Events (JSONL)",
        data=lambda: "".join(json.dumps(row, default=str) + "\n" for row in data.events(db, job_id).to_dict("records")),
        file_name=f"drainboard-job{job_id}-events.jsonl",
        mime="application/jsonl",
        on_click="ignore",
        icon=":material/list:",
    )
    for note in notes:
        st.caption(note)


def main() -> None:
    job = chosen_job()
    total_bytes, _ = job_sizes(job)
    live = not jv.is_final(job)
    draw_header(job, total_bytes)
    told = None if live else job_outcome(job, total_bytes)
    if told is not None:
        draw_outcome(told)
    x_choice, fit, paused = draw_controls(job, total_bytes, live)
    if live and not paused:
        st.session_state[LIVE_KEY] = job["id"]
        st.fragment(draw_body, run_every=LIVE_EVERY)(job["id"], x_choice, fit)
    else:
        draw_body(job["id"], x_choice, fit)
    if told is not None:
        draw_outcome_details(job, told)
    draw_details(job)
    if told is not None:
        draw_retry(job, told.suggested_limit)
        draw_downloads(job["id"])


main()
