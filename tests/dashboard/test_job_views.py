"""The Job page's words and cards, as plain functions of made-up rows."""

from __future__ import annotations

import pandas as pd
from dashboard import format as fmt
from core.sizes import format_size
import pytest

from dashboard.host import memory_kind, pool_caption
from dashboard.views import failure
from dashboard.views import cards as cv
from dashboard.views import job_tables as tv
from dashboard.views import jobs as jv
from dashboard.views import outcome as oc
from machine.device import DeviceInfo
from models.speed.levers import COMPILE_CALLS

GIB = 2**30


def _device(kind: str, unified: bool) -> DeviceInfo:
    return DeviceInfo(kind, kind, 0 if kind == "cuda" else None, kind, unified, 8 * GIB, kind, "test")


def test_generate_cards_show_steps_with_seconds_per_step_and_the_peak_stage(load_samples):
    job = {"kind": "generate", "status": "succeeded", "progress_done": 8, "progress_total": 8,
           "metrics": {"peak_footprint": GIB, "stage_peaks": {"conditioning": GIB, "denoise.denoise": GIB // 2},
                       "stage_seconds": {"denoise.denoise": 4.0}}}
    cards = {c.label: c for c in cv.metric_cards(job, jv.live_stats(load_samples, 24 * GIB), total_bytes=GIB, capacity=24 * GIB)}
    assert list(cards) == ["Transformer passes", "Peak in use", "Peak footprint", "Min headroom", "Peak VmRSS"]
    assert (cards["Transformer passes"].value, cards["Transformer passes"].delta) == ("8/8", "0.50 s per pass")
    assert (cards["Peak footprint"].value, cards["Peak footprint"].delta) == ("1.0 GiB", "while conditioning")
    assert "conditioning 1.00 GiB · denoise.denoise 512.0 MiB" in cards["Peak footprint"].help


def test_a_cached_generate_job_shows_its_passes_computed_and_reused(load_samples):
    metrics = {"stage_seconds": {"denoise.denoise": 4.0}, "steps": 7, "steps_computed": 4, "steps_reused": 3}
    job = {"kind": "generate", "status": "succeeded", "progress_done": 7, "progress_total": 7,
           "metrics": metrics | {"levers": {"step_cache": "taylorseer"}}}
    stats = jv.live_stats(load_samples, 24 * GIB)
    cards = {c.label: c for c in cv.metric_cards(job, stats, total_bytes=GIB, capacity=24 * GIB)}
    assert (cards["Step cache"].value, cards["Step cache"].delta) == ("4 computed", "3 reused")
    assert cards["Step cache"].help.startswith("taylorseer: ") and "diffusers' hooks keep no count" in \
        cards["Step cache"].help
    plain = job | {"metrics": metrics | {"levers": {"step_cache": None}}}
    assert "Step cache" not in {c.label for c in cv.metric_cards(plain, stats, total_bytes=GIB, capacity=24 * GIB)}
    assert "Ranks" not in {c.label for c in cv.metric_cards(plain, stats, total_bytes=GIB, capacity=24 * GIB)}
    parallel = job | {"metrics": metrics | {"ranks": [{"rank": 0, "peak": 3 * GIB}, {"rank": 1, "peak": 4 * GIB}]}}
    card = {c.label: c for c in cv.metric_cards(parallel, stats, total_bytes=GIB, capacity=24 * GIB)}["Ranks"]
    assert (card.value, card.delta) == ("2 GPUs", "largest peak 4.00 GiB on rank 1")
    assert card.help.endswith("rank 0 3.00 GiB · rank 1 4.00 GiB")
    assert tv.metrics_table(job["metrics"]).set_index("metric").loc[
        ["Transformer passes computed", "Transformer passes reused (step cache)"], "value"].tolist() == ["4", "3"]


def test_a_running_generate_job_measures_steps_from_when_denoising_started(load_samples):
    job = {"kind": "generate", "status": "running", "stage": "denoising", "progress_done": 2, "progress_total": 10, "metrics": None}
    events = pd.DataFrame({"t": [0.5, 9.9], "kind": ["stage_start", "stage_start"], "stage": ["conditioning", "denoise.denoise"]})
    stats = jv.live_stats(load_samples, 24 * GIB)  # last sample at t = 11.9
    cards = {c.label: c for c in cv.metric_cards(job, stats, total_bytes=None, capacity=None, events=events)}
    assert cards["Transformer passes"].delta == "1.00 s per pass"
    # Live peak footprint: max of VmRSS + device allocated, and the stage it happened in.
    assert cards["Peak footprint"].value == "2.2 GiB"
    assert cards["Peak footprint"].delta == "while loading"
    assert "placed" not in jv.status_label(job, stats, GIB)


def test_seconds_per_pass_freeze_when_denoising_ends():
    job = {"kind": "generate", "status": "running", "stage": "decode.video", "progress_done": 2, "progress_total": 2}
    events = pd.DataFrame({"t": [2.0, 6.0], "kind": ["stage_start", "stage_end"],
                           "stage": ["denoise.denoise", "denoise.denoise"]})
    assert cv.seconds_per_step(job, events, elapsed=30.0) == 2.0  # decoding for 24 s more changes nothing


def test_a_compiled_dit_s_calls_that_compile_are_left_out_of_seconds_per_pass_live_and_finished():
    # denoise.denoise opens at 2, the compile stage cuts the first call out (2.1 to 40), the loop goes on from 40;
    # the second call compiles again (40.5 to 60), then the loop runs on.
    events = pd.DataFrame({"t": [2.0, 2.1, 2.1, 40.0, 40.0], "stage": ["denoise.denoise", "denoise.denoise",
                                                                      "denoise.compile", "denoise.compile",
                                                                      "denoise.denoise"],
                           "kind": ["stage_start", "stage_end", "stage_start", "stage_end", "stage_start"]})
    running = {"kind": "generate", "status": "running", "progress_done": 3, "progress_total": 8, "metrics": None}
    assert cv.seconds_per_step(running, events, elapsed=44.1) == pytest.approx((0.1 + 4.1) / 2)
    second = pd.concat([events, pd.DataFrame({"t": [40.5, 40.5, 60.0, 60.0], "kind": ["stage_end", "stage_start",
                                                                                  "stage_end", "stage_start"],
                                              "stage": ["denoise.denoise", "denoise.compile", "denoise.compile",
                                                        "denoise.denoise"]})])
    assert cv.seconds_per_step(running, second, elapsed=62.0) == pytest.approx((0.1 + 0.5 + 2.0) / 1)
    finished = {**running, "progress_done": 7,
                "metrics": {"stage_seconds": {"denoise.denoise": 12.0, "denoise.compile": 58.0}}}
    assert cv.seconds_per_step(finished, None, 0.0) == 12.0 / (7 - COMPILE_CALLS)


def test_the_start_of_a_generate_says_what_is_happening_not_the_probe_stage():
    job = {"kind": "generate", "status": "running", "stage": "probe", "started_at": 100.0}
    stats = jv.live_stats(pd.DataFrame({"rank": 0, "t": [0.01], "stage": "probe", "bytes_placed": 0,
                                        "vm_rss": GIB, "device_allocated": 0, "mem_available": GIB}), None)
    label = jv.status_label(job, stats, None, now=117.0)
    assert label == "Starting the job: importing the pipeline, then loading the text encoder… · 17.0 s"


def test_before_denoising_the_steps_card_says_nothing_rather_than_zero(load_samples):
    job = {"kind": "generate", "status": "running", "progress_done": None, "progress_total": None}
    cards = cv.metric_cards(job, jv.live_stats(load_samples, None), total_bytes=None, capacity=None)
    assert (cards[0].value, cards[0].delta) == ("—", None)


def test_load_cards_keep_placement_and_footprint_ratio(load_samples):
    job = {"kind": "load", "status": "succeeded", "metrics": {"footprint_ratio": 1.2}}
    labels = [c.label for c in cv.metric_cards(job, jv.live_stats(load_samples, 24 * GIB), total_bytes=2 * GIB, capacity=24 * GIB)]
    assert labels[:3] == ["Placed", "Peak in use", "Footprint ratio"]


@pytest.mark.parametrize(
    ("devices", "caption"),
    [
        ([_device("cpu", True)], "host memory"),
        ([_device("cpu", True), _device("cuda", False)], "host memory"),
        ([_device("cpu", True), _device("cuda", True)], "unified memory: GPU and CPU share this pool"),
    ],
)
def test_the_memory_bar_says_unified_only_when_a_probed_gpu_is(devices, caption):
    assert pool_caption(devices) == caption


def test_a_cpu_job_runs_in_host_memory():
    assert memory_kind(_device("cpu", True)) == "host memory"
    assert memory_kind(_device("cuda", False)) == "discrete memory"
    assert memory_kind(_device("cuda", True)) == "unified memory"


def _no_samples() -> jv.LiveStats:
    return jv.live_stats(pd.DataFrame(), None)


def test_a_failed_job_shows_every_line_of_its_error_without_the_class_name():
    error = "CheckpointError: 3 problems:\n  a.safetensors: truncated\n  b.safetensors: bad header\n  c: missing key w"
    told = oc.outcome({"status": "failed", "kind": "load", "error": error}, _no_samples(), None)
    assert told.tone == "error"
    assert told.cause == ["3 problems:", "a.safetensors: truncated", "b.safetensors: bad header", "c: missing key w"]
    assert "CheckpointError" not in told.headline and told.raw == error  # verbatim only on demand
    # A fuller error the runner kept wins over the stored one-line summary.
    detailed = oc.outcome({"status": "failed", "kind": "load", "error": "3 problems", "error_detail": error}, _no_samples(), None)
    assert detailed.cause == told.cause


def test_a_user_cancel_is_not_styled_as_an_error():
    told = oc.outcome({"status": "cancelled", "kind": "load", "error": "cancelled while running (SIGTERM)"}, _no_samples(), None)
    assert told.tone == "info"
    assert told.headline.startswith("Cancelled by the user")
    assert jv.status_state("cancelled") == "complete"
    assert jv.status_state("failed") == "error"


def test_a_guard_kill_says_it_was_the_memory_guard():
    job = {"status": "killed", "kind": "load", "signal": "SIGKILL",
           "error": "memory guard: system in use grew 412 MiB over the job's start, budget 400 MiB, at tensor 31 of 48"}
    assert jv.kill_kind(job) == "guard"
    assert jv.status_label(job, _no_samples(), None).startswith("Killed (SIGKILL) by the memory guard")


def test_a_failed_load_reads_failed_not_killed_on_the_footprint_card():
    job = {"kind": "load", "status": "failed", "metrics": None, "error": "CheckpointError: bad"}
    cards = {c.label: c for c in cv.metric_cards(job, _no_samples(), total_bytes=GIB, capacity=None)}
    assert cards["Footprint ratio"].value == "— (failed)"


@pytest.mark.parametrize(
    ("status", "mode", "error", "choices"),
    [
        ("succeeded", "retain", None, []),
        ("cancelled", "retain", "cancelled while running (SIGTERM)", ["same settings"]),
        ("failed", "retain", "CheckpointError: truncated", ["same settings"]),
        ("killed", "retain", "killed (SIGKILL), most likely by the kernel OOM killer", ["same settings", "stream", "drain"]),
        ("killed", "drain", "memory guard: budget 400 MiB crossed", ["same settings", "stream"]),
        # stream is the cheapest mode: drain would not avoid the OOM.
        ("killed", "stream", "killed (SIGKILL), most likely by the kernel OOM killer", ["same settings"]),
        ("killed", "retain", "killed by SIGTERM", ["same settings"]),
    ],
)
def test_retry_offers_only_what_could_change_the_outcome(status, mode, error, choices):
    assert oc.retry_choices({"status": status, "spec": {"mode": mode}, "error": error}) == choices


def _job(id_, *, model="/m/a", component=None, mode="stream", kind="load", ratio=1.0, status="succeeded"):
    return {"id": id_, "kind": kind, "status": status, "spec": {"model": model, "component": component, "mode": mode},
            "metrics": {"footprint_ratio": ratio}}


def test_deltas_compare_only_jobs_of_the_same_checkpoint_component_and_mode():
    job = _job(9, ratio=1.2)
    candidates = [_job(8, model="/m/other"), _job(7, component="vae"), _job(6, mode="drain"), _job(5, kind="generate"),
                  _job(4, status="failed"), _job(3, ratio=1.0), _job(2)]
    assert cv.comparable_previous(job, candidates)["id"] == 3
    assert cv.comparable_previous(_job(1), candidates) is None


def test_no_change_in_footprint_is_neutral_and_never_plus_zero(load_samples):
    stats = jv.live_stats(load_samples, 24 * GIB)
    same = cv.metric_cards(_job(9, ratio=1.001), stats, total_bytes=2 * GIB, capacity=None, previous=_job(3, ratio=1.0))
    card = next(c for c in same if c.label == "Footprint ratio")
    assert (card.delta, card.delta_color) == ("same as job 3", "off")
    better = cv.metric_cards(_job(9, ratio=1.0), stats, total_bytes=2 * GIB, capacity=None, previous=_job(3, ratio=2.0))
    card = next(c for c in better if c.label == "Footprint ratio")
    assert (card.delta, card.delta_color) == ("-1.00× vs job 3", "inverse")


def test_header_status_line_and_cards_quote_one_progress():
    job = {"id": 4, "kind": "generate", "status": "running", "stage": "denoise.denoise", "progress_done": 3, "progress_total": 6,
           "started_at": 1.0, "metrics": None}
    stats = jv.live_stats(make_frame(), None)
    chip = jv.queue_chip([job])
    label = jv.status_label(job, stats, None)
    steps = cv.metric_cards(job, stats, total_bytes=None, capacity=None)[0].value
    assert "denoising 3/6" in chip and label.startswith("denoising 3/6") and steps == "3/6"


def make_frame() -> pd.DataFrame:
    from tests.dashboard.conftest import make_samples

    return make_samples(20)


def test_load_throughput_reads_in_gb_per_second_like_the_metrics(load_samples):
    stats = jv.live_stats(load_samples, 24 * GIB)
    live = cv.metric_cards({"kind": "load", "status": "running", "metrics": None}, stats, total_bytes=2 * GIB, capacity=None)
    assert live[0].delta.endswith(f"· {stats.throughput / 1e9:.2f} GB/s")
    done = cv.metric_cards({"kind": "load", "status": "succeeded", "metrics": {"throughput_gbps": 0.46}}, stats,
                           total_bytes=2 * GIB, capacity=None)
    assert done[0].delta.endswith("· 0.46 GB/s")


def test_a_generate_jobs_component_loads_are_one_row_each():
    metrics = {"loads": {"transformer": {"mode": "stream", "device": "cpu", "tensors_placed": 41, "bytes_placed": 3 * 2**29,
                                         "load_seconds": 2.5, "throughput_gbps": 0.64, "footprint_ratio": 1.01,
                                         "host_peak_ratio": 1.0, "excluded_bytes": 0},
                         "vae": {"mode": "stream", "device": "cpu", "tensors_placed": 9, "bytes_placed": 2**20 * 300}}}
    table = tv.load_reports_table(metrics).set_index("component")
    assert table.loc["transformer", "placed"] == "1.50 GiB"
    assert table.loc["transformer", "throughput"] == "0.64 GB/s"
    assert table.loc["video decoder", "placed"] == "300.0 MiB"
    assert table.loc["video decoder", "footprint"] == "—"
    assert tv.load_reports_table({}).empty


def test_a_killed_load_draws_the_predicted_peak_its_forecast_event_recorded():
    import pandas as pd

    events = pd.DataFrame([{"kind": "device", "data": {}}, {"kind": "forecast", "data": {"predicted_peak_bytes": 123}}])
    assert oc.predicted_peak({"metrics": None, "spec": {}}, events) == 123
    assert oc.predicted_peak({"metrics": None, "spec": {}}, events.iloc[:1]) is None


def test_a_strict_load_failure_drops_the_python_argument_and_the_class_name():
    error = ("PlacementError: strict load failed; 1 missing from /m/t: a.weight; 1 unexpected in /m/t: b.weight "
             "(pass strict=False to load anyway)")
    told = oc.outcome({"status": "failed", "kind": "load", "error": error}, _no_samples(), None)
    assert told.headline == "Failed at 0 B placed · t = 0.00 s: strict load failed; 1 missing from /m/t: a.weight; 1 unexpected in /m/t: b.weight"
    assert not any("strict=False" in line or "PlacementError" in line for line in told.cause)


def test_a_truncated_shards_tensor_lines_fold_into_one_sentence():
    lines = [f"model-00002-of-00003.safetensors: tensor 'blocks.{i}.w' has data_offsets [{i * 10**6}, {16_270_000 - i}] "
             f"past the end of the 8990000-byte data area (truncated?)" for i in range(19)]
    folded = failure.fold(["2 problems:", *lines, "other.safetensors: bad header"])
    assert folded == [
        "2 problems:",
        "shard 2 of 3 (model-00002-of-00003.safetensors) is truncated (8.6 MiB of 15.5 MiB of data, 19 tensors cut off): "
        "copy it again",
        "other.safetensors: bad header",
    ]


def test_a_limit_kill_suggests_the_smallest_limit_that_would_have_worked_and_retries_with_it():
    job = {"status": "killed", "kind": "load", "signal": "SIGKILL", "spec": {"mode": "retain", "memory_limit": GIB},
           "error": "killed (SIGKILL) by the kernel OOM killer in the job's memory cgroup: limit 1.00 GiB reached"}
    samples = pd.DataFrame({"rank": 0, "t": [0.0, 1.0], "stage": "load", "bytes_placed": [0, GIB],
                            "vm_rss": [GIB // 4, GIB], "device_allocated": 0, "mem_available": 8 * GIB,
                            "cgroup_usage": [GIB // 4, GIB]})
    stats = jv.live_stats(samples, 16 * GIB)
    told = oc.outcome(job, stats, 2 * GIB, samples=samples)
    # Half placed at 1 GiB from a 0.25 GiB start: the whole load needs 0.25 + 2 * 0.75 = 1.75 GiB, +10%, rounded up.
    assert told.suggested_limit == failure.round_up(1.75 * GIB * 1.1)
    assert "retry with a limit of 2.0 GiB" in told.next_step
    choices = oc.retry_choices(job, told.suggested_limit)
    assert choices == ["a limit of 2.0 GiB", "stream", "drain"]  # never the same settings, killed again
    assert oc.retry_changes(choices[0], told.suggested_limit) == {"memory_limit": told.suggested_limit}


def test_a_forced_job_killed_at_its_limit_is_told_the_submit_checks_own_need(tiny_checkpoint, data_dir):
    """One number: what the Run page and a refusal said the load needs of a limit is what a retry is told."""
    from jobs.admission import assess
    from jobs.spec import JobSpec
    from storage.config import load_config

    spec = JobSpec("load", str(tiny_checkpoint), memory_limit=4096, forced=True)
    found = assess(spec, load_config()).to_dict()
    job = {"status": "killed", "kind": "load", "signal": "SIGKILL",
           "spec": {**spec.to_dict(), "forecast": found},
           "error": "killed (SIGKILL) by the kernel OOM killer in the job's memory cgroup: limit 4 KiB reached"}
    samples = pd.DataFrame({"rank": 0, "t": [0.0], "stage": "load", "bytes_placed": [0], "vm_rss": [GIB // 4],
                            "device_allocated": 0, "mem_available": 8 * GIB, "cgroup_usage": [4096]})
    told = oc.outcome(job, jv.live_stats(samples, 16 * GIB), 2 * GIB, samples=samples)
    assert told.suggested_limit == found["needs"]["limit"] == found["need"]
    assert found["refusal"].startswith(f"refused: needs {format_size(found['need'])}, over the 4,096 bytes memory limit")
    assert f"retry with a limit of {fmt.gib(found['need'])}" in told.next_step


def test_every_kill_says_what_to_do_next():
    guard = failure.next_step("guard", limit=None, budget=400 * 2**20, suggested_limit=None, mode="drain")
    assert "budget of 400 MiB" in guard
    oom = failure.next_step("oom", limit=None, budget=None, suggested_limit=None, mode="retain")
    assert "close programs" in oom and "stream" in oom


def test_the_chart_scales_to_the_series_whose_bound_killed_the_job():
    limit_kill = {"status": "killed", "error": "killed (SIGKILL) by the kernel OOM killer in the job's memory cgroup: "
                  "limit 2.00 GiB reached", "spec": {"memory_limit": 2 * GIB}}
    assert oc.kill_series(limit_kill) == "cgroup usage"
    assert oc.kill_series({"status": "killed", "error": "memory guard: system in use grew 5 GiB", "spec": {}}) == \
        "System in use"
    assert oc.kill_series({"status": "killed", "error": "killed (SIGKILL), most likely by the kernel OOM killer",
                           "spec": {}}) is None
    assert oc.kill_series({"status": "succeeded", "error": None, "spec": {}}) is None


def test_the_pass_counter_stays_with_denoising_and_encode_is_writing_the_video():
    from jobs.stage_words import progress_text

    later = {"id": 5, "kind": "generate", "status": "running", "stage": "load.audio_vae", "progress_done": 2,
             "progress_total": 2, "started_at": 1.0, "metrics": None}
    assert jv.queue_chip([later]) == "▶ 1 running: job 5 (loading the audio decoder)"
    assert jv.progress(later).fraction is None
    assert progress_text("encode", 2, 2) == "writing the video"
    # A compile's first calls, cut out of the loop or the decode, are named as what they are, not as that stage.
    assert progress_text("denoise.compile", 1, 4) == "compiling the transformer (its first denoising steps)"
    assert progress_text("decode.compile", 4, 4) == "compiling the video decoder (its first tile)"
    assert progress_text("load", 13, 41) == "loading 13/41"


def test_a_forced_job_says_so_and_why_and_its_retry_says_it_inherited_it():
    from dashboard.views.outcome import forced_note

    spec = {"forced": True, "forecast": {"refusal": "refused: text_encoder would peak at 70.9 MiB, over the 50.0 MiB budget"}}
    assert forced_note({"id": 6, "spec": spec}) == (
        "Queued anyway: the submit check refused it (text_encoder would peak at 70.9 MiB, over the 50.0 MiB budget).")
    assert forced_note({"id": 8, "retry_of": 6, "spec": spec}).startswith(
        "Queued anyway (inherited from job 6, which this job retries): the submit check refused it")
    assert forced_note({"id": 9, "spec": {"forced": True, "forecast": {"refusal": None}}}) == (
        "Queued anyway, though the submit check found it fits.")
    assert forced_note({"id": 7, "spec": {"forced": False}}) is None


def test_no_advice_to_choose_stream_for_a_job_already_on_stream():
    from dashboard.views.failure import next_step

    on_stream = next_step("guard", limit=None, budget=50 * 2**20, suggested_limit=None, mode="stream")
    assert on_stream == "The memory guard stopped it at its memory budget of 50 MiB, before the kernel had to: raise the budget."
    assert "choose a cheaper mode (stream" in next_step("guard", limit=None, budget=2**30, suggested_limit=None, mode="drain")
    limited = next_step("oom", limit=2**30, budget=None, suggested_limit=2**31, mode="stream")
    assert "cheaper mode" not in limited and limited.endswith("retry with a limit of 2.0 GiB.")


def test_supervisor_ids_and_unknown_signals_stay_off_the_page():
    from dashboard.views.failure import plain

    said = plain("interrupted: its supervisor (box-7:4242:1a2b3c4d) stopped while the job was running")
    assert said == "interrupted: its supervisor stopped while the job was running"
    job = {"id": 3, "kind": "generate", "status": "killed", "signal": None, "started_at": 1.0, "metrics": None,
           "error": "memory guard: system in use grew 53.4 MiB over the job's start"}
    assert jv.status_label(job, jv.live_stats(make_frame(), None), None).startswith("Killed by the memory guard at t =")


def test_a_loads_start_up_is_said_apart_and_its_chart_starts_at_the_first_tensor():
    import numpy as np

    from dashboard import charts

    frame = make_frame()
    start = frame.iloc[:1].assign(t=-7.8, bytes_placed=np.nan, vm_rss=197 * 2**20, stage="probe")
    samples = pd.concat([start, frame], ignore_index=True)
    text = jv.startup_text(samples)
    assert text.startswith("Before its first tensor the job's process started up for 7.80 s") and "197 MiB" in text
    assert charts.from_first_placement(samples)["bytes_placed"].notna().all()
    assert len(charts.from_first_placement(samples)) == len(frame)
    assert jv.startup_text(frame) is None


def test_a_queued_job_says_its_place_and_what_it_waits_behind():
    active = [{"id": 7, "status": "running"}, {"id": 12, "status": "queued"}, {"id": 9, "status": "queued"},
              {"id": 11, "status": "queued"}]
    places = jv.queue_places(active)
    assert places == {12: "next in the queue, behind job 7 (running)",
                      9: "2nd in the queue, behind job 7 (running) and job 12",
                      11: "3rd in the queue, behind job 7 (running) and jobs 12, 9"}
    assert jv.queue_places([{"id": 3, "status": "queued"}]) == {3: "next in the queue: it starts when a worker is free"}
