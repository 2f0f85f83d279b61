"""Compare: two to five jobs overlaid on a shared axis, their parameters and metrics against a reference, their videos.

Each mode keeps its dash and each series its colour and panel on every view;
with nothing chosen, only jobs of one checkpoint are suggested.
"""

import pandas as pd
import streamlit as st

from core.echo import echo
from dashboard import charts, data, nav
from dashboard.host import read_host_memory
from dashboard.inputs_panel import input_strip, output_videos
from dashboard.views import ab
from dashboard.views.history import checkpoints_of, comparison_table, default_comparison, diff_only, job_summary
from dashboard.views.query import QueryError, job_ids
from dashboard.views.spec import job_label, spec_mode
from dashboard.charts.style import readable

db = data.db_path()
mem_total = read_host_memory().total


def from_query(by_id: dict[int, dict]) -> list[int]:
    """The jobs `?jobs=` names; a malformed list or unknown ids are said, never crash the page."""
    try:
        wanted = job_ids(st.query_params.get("jobs", ""))
    except QueryError as e:
        st.error(str(e))
        return []
    missing = [i for i in wanted if i not in by_id]
    if missing:
        st.warning(f"There is no job {', '.join(map(str, missing))}.")
    return [i for i in wanted if i in by_id][: charts.MAX_COMPARED]


def pick_jobs(all_jobs: list[dict]) -> list[dict]:
    by_id = {j["id"]: j for j in all_jobs}
    chosen = st.multiselect(
        "Jobs (the first is the baseline)",
        list(by_id),
        default=from_query(by_id) or default_comparison(all_jobs, charts.MAX_COMPARED),
        format_func=lambda i: f"{job_label(by_id[i])} · {by_id[i]['status']}",
        max_selections=charts.MAX_COMPARED,
    )
    st.query_params["jobs"] = ",".join(map(str, chosen))
    return [by_id[i] for i in chosen]


def draw_chart(jobs: list[dict], summaries: dict[int, dict]) -> None:
    c1, c2, c3, c4 = st.columns(4)
    # Generate jobs place everything before their stages run, so only time separates their curves.
    all_loads = all(j["kind"] == "load" for j in jobs)
    default_x = "% placed" if all_loads else "seconds"
    # Loads differ by what their mode adds on top of the process and the machine (`Placement.typical_footprint`);
    # in absolute GiB that baseline dwarfs a small checkpoint and the curves sit on top of each other.
    default_y = "× checkpoint" if all_loads else "GiB"
    x_axis = c1.segmented_control("x", ["% placed", "seconds"], default=default_x, key="compare_x") or default_x
    y_axis = c2.segmented_control("y", ["GiB", "× checkpoint"], default=default_y, key="compare_y") or default_y
    subtract = c3.toggle("Subtract start", value=all_loads, key="compare_subtract",
                         help="Subtract each job's first sample from its curves, so jobs that began at different use line up")
    whole_pool = c4.toggle("Whole pool on y", value=False, key="compare_pool")
    frames = []
    for job in jobs:
        samples = data.series(db, job["id"], data.sample_count(db, job["id"]))
        summaries[job["id"]] = job_summary(samples, mem_total)
        total = (job.get("metrics") or {}).get("bytes_placed") or data.expected_bytes(job) or int(samples["bytes_placed"].max() or 1)
        footprint = (job.get("metrics") or {}).get("footprint_ratio")
        frames.append(samples.assign(job=job_label(job), mode=spec_mode(job), job_id=job["id"], total_bytes=total,
                                     mem_total=mem_total, footprint=footprint))
    chart = charts.compare_chart(
        pd.concat(frames, ignore_index=True),
        x="percent" if x_axis == "% placed" else "seconds",
        y="ratio" if y_axis == "× checkpoint" else "gib",
        subtract_start=subtract,
        capacity=mem_total,
        fit="pool" if whole_pool else "data",
        theme=st.context.theme.type,
    )
    st.altair_chart(readable(chart, st.context.theme.type), width="stretch")
    if y_axis == "× checkpoint":
        st.caption(
            "Job's own memory: its growth in VmRSS plus GPU allocated from its first placement on (the process "
            "starting up is left out), over its checkpoint size; its peak is the footprint ratio the Job page and "
            "History show (1.0× is the model itself). The other panels are each series over that job's checkpoint "
            "size; System in use is the whole machine, so with a small checkpoint other processes move it as much "
            "as the load does."
        )


def draw_tables(jobs: list[dict], summaries: dict[int, dict]) -> None:
    st.subheader("Parameters and metrics")
    ids = [j["id"] for j in jobs]
    by_id = {j["id"]: j for j in jobs}
    reference = st.selectbox("Reference job", ids, format_func=lambda i: job_label(by_id[i]), key="compare_ref")
    table = comparison_table(jobs, summaries, reference)
    if st.toggle("Diff only", value=False, key="compare_diff", help="Only the parameters and metrics that differ"):
        table = diff_only(table)
    st.dataframe(table, hide_index=True, width="stretch")


def draw_videos(jobs: list[dict]) -> None:
    """Each generate job's input images (from its own folder) above its video, three jobs to a row at most."""
    shown = [(job, data.artifacts(db, job["id"])) for job in jobs if job["kind"] == "generate"]
    shown = [(job, files) for job, files in shown
             if output_videos(files) or any(a["media_type"].startswith("image/") for a in files)]
    if not shown:
        return
    st.subheader("Inputs and videos")
    for column, (job, files) in zip(st.columns(min(3, len(shown))), shown[:3]):
        with column:
            st.caption(job_label(job))
            input_strip(files, lambda name, job_id=job["id"]: data.artifact_path(job_id, name))
            video = next(iter(output_videos(files)), None)
            if video is not None:
                st.video(str(data.artifact_path(job["id"], video["name"])), loop=True)


@st.cache_data(max_entries=8, show_spinner="Comparing frames…")
def frame_distance(path_a: str, path_b: str, stamp: tuple[float, float]) -> ab.FrameDiff:
    """B's frames against A's (cached per pair of files, `stamp` their mtimes)."""
    return ab.frame_diff(ab.read_frames(path_a), ab.read_frames(path_b))


def draw_ab(jobs: list[dict]) -> None:
    """PSNR and SSIM per frame of B against A (same prompt and seed), the worst frame's difference, and B's costs
    against A's: how a lossy lever or a LoRA is judged on real weights."""
    videos = {}
    for job in jobs:
        video = next(iter(output_videos(data.artifacts(db, job["id"]))), None) if job["kind"] == "generate" else None
        if video is not None:
            videos[job["id"]] = data.artifact_path(job["id"], video["name"])
    if len(videos) < 2:
        return
    st.subheader("A/B: frames and costs")
    by_id = {j["id"]: j for j in jobs}
    ids = list(videos)
    left, right = st.columns(2)
    a = left.selectbox("A (the exact run)", ids, index=0, key="ab_a", format_func=lambda i: job_label(by_id[i]))
    b = right.selectbox("B (with the lever)", ids, index=1, key="ab_b", format_func=lambda i: job_label(by_id[i]))
    if a == b:
        st.info("Pick two different jobs for A and B.")
        return
    mismatch = ab.request_mismatch(by_id[a], by_id[b])
    if mismatch:
        st.warning(f"A and B differ in {', '.join(mismatch)}: not the same request, so their frames are not compared.")
        return
    try:
        diff = frame_distance(str(videos[a]), str(videos[b]), (videos[a].stat().st_mtime, videos[b].stat().st_mtime))
    except (OSError, ValueError) as e:
        st.error(f"Cannot compare the videos: {echo(str(e))}")
        return
    theme = st.context.theme.type
    st.altair_chart(readable(charts.quality_chart(charts.quality_frame(diff.psnr, diff.ssim), diff.worst, theme=theme),
                             theme), width="stretch")
    identical = sum(1 for v in diff.psnr if v == float("inf"))
    st.caption(f"Worst frame: {diff.worst} (SSIM {diff.ssim[diff.worst]:.4f}). "
               + (f"{identical} of {len(diff.psnr)} frames are identical (infinite PSNR, not drawn). " if identical else "")
               + "PSNR and SSIM from scikit-image, on the MP4s' decoded frames.")
    left, right = st.columns([1, 2])
    left.image(diff.difference, clamp=True, width="stretch",
               caption=f"|A - B| at frame {diff.worst}, white = {diff.difference_max} of 255")
    right.dataframe(pd.DataFrame(ab.cost_deltas(by_id[a], by_id[b])), hide_index=True, width="stretch")


def main() -> None:
    st.title("Compare")
    all_jobs = data.jobs(db)
    jobs = pick_jobs(all_jobs)
    if len(jobs) < 2:
        st.info("Pick at least two jobs to compare (or select rows on the History page). With none chosen, the "
                "latest finished job of each mode of one checkpoint is suggested.")
        if not all_jobs and st.button("Go to Run"):
            nav.goto("run")
        st.stop()
    mixed = checkpoints_of(jobs)
    if len(mixed) > 1:
        st.warning(f"Different checkpoints or job kinds: {', '.join(mixed)}. Their curves are drawn, but ratios "
                   "against the reference are given only for jobs of its own checkpoint and kind.")
    summaries: dict[int, dict] = {}
    draw_chart(jobs, summaries)
    draw_tables(jobs, summaries)
    draw_ab(jobs)
    draw_videos(jobs)


main()
