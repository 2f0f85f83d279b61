"""The pure views of predicted seconds: Run page durations, Job page time left and predicted vs measured."""

from dashboard.views import eta as ev

FORECAST = {"eta": [{"stage": "load.transformer", "seconds": 10.0, "basis": "median of 2 past runs"},
                    {"stage": "denoise.denoise", "seconds": 100.0, "basis": "median of 2 past runs"},
                    {"stage": "decode.video", "seconds": 30.0, "basis": "median of 2 past runs"}]}
NO_HISTORY = {"eta": [{"stage": "text_encoder", "seconds": None, "basis": "no history on this machine"},
                      {"stage": "decode.video", "seconds": 5.0, "basis": "median of 1 past run"}]}


def test_durations_per_stage_and_the_total_or_why_there_is_none():
    assert ev.duration_rows(FORECAST)[1] == {"stage": "denoising", "predicted": "1 min 40 s",
                                             "basis": "median of 2 past runs"}
    assert ev.duration_summary(FORECAST).startswith("Predicted duration 2 min 20 s")
    assert ev.duration_summary(NO_HISTORY) == "Predicted duration unknown: no history on this machine for 1 of 2 stages."
    assert ev.duration_rows(NO_HISTORY)[0]["predicted"] == "-"


def test_time_left_counts_the_stages_to_come_and_what_remains_of_the_running_one():
    events = [{"kind": "stage_start", "stage": "load.transformer", "created_at": 0.0},
              {"kind": "stage_end", "stage": "load.transformer", "created_at": 9.0},
              {"kind": "stage_start", "stage": "denoise.denoise", "created_at": 9.0}]
    done, current, elapsed = ev.stage_progress(events, now=29.0)
    assert (done, current, elapsed) == (["load.transformer"], "denoise.denoise", 20.0)
    assert ev.time_left_text(FORECAST, done, current, elapsed) == "About 1 min 50 s left."
    assert ev.time_left_text(FORECAST, done, current, elapsed, step_share=0.5) == "About 1 min 20 s left."
    assert ev.time_left_text(NO_HISTORY, [], "text_encoder", 1.0).startswith("Time left unknown: no history")
    assert ev.time_left_text(None, [], None, 0.0) == "Time left unknown: the job recorded no forecast."


def test_time_left_of_a_compiled_run_counts_the_stage_a_compile_was_cut_from_until_it_ends():
    forecast = {"eta": [{"stage": "denoise.denoise", "seconds": 100.0, "basis": "median of 2 past runs"},
                        {"stage": "denoise.compile", "seconds": 40.0, "basis": "median of 2 past runs"},
                        {"stage": "decode.video", "seconds": 30.0, "basis": "median of 2 past runs"},
                        {"stage": "decode.compile", "seconds": 20.0, "basis": "median of 2 past runs"}]}
    # The loop's stage opens, its first call is cut out as the compile's stage, then the loop goes on.
    events = [{"kind": "stage_start", "stage": "denoise.denoise", "created_at": 0.0},
              {"kind": "stage_end", "stage": "denoise.denoise", "created_at": 0.5},
              {"kind": "stage_start", "stage": "denoise.compile", "created_at": 0.5}]
    done, current, elapsed = ev.stage_progress(events, now=10.5)
    assert (done, current, elapsed) == ([], "denoise.compile", 10.0)
    assert ev.time_left_text(forecast, done, current, elapsed) == "About 3 min 0 s left."  # 30 + 100 + 30 + 20
    events += [{"kind": "stage_end", "stage": "denoise.compile", "created_at": 40.5},
               {"kind": "stage_start", "stage": "denoise.denoise", "created_at": 40.5}]
    done, current, elapsed = ev.stage_progress(events, now=50.5)
    assert (done, current) == (["denoise.compile"], "denoise.denoise")
    assert ev.time_left_text(forecast, done, current, elapsed, step_share=0.5) == "About 1 min 40 s left."
    events += [{"kind": "stage_end", "stage": "denoise.denoise", "created_at": 140.5},
               {"kind": "stage_start", "stage": "decode.video", "created_at": 140.5},
               {"kind": "stage_end", "stage": "decode.video", "created_at": 141.0},
               {"kind": "stage_start", "stage": "decode.compile", "created_at": 141.0}]
    done, current, elapsed = ev.stage_progress(events, now=146.0)
    assert (sorted(done), current) == (["denoise.compile", "denoise.denoise"], "decode.compile")
    assert ev.time_left_text(forecast, done, current, elapsed) == "About 45 s left."  # 15 of the compile + 30


def test_predicted_against_measured_seconds_per_stage():
    rows = ev.predicted_vs_measured(FORECAST, {"denoise.denoise": 120.0, "decode.video": 30.0})
    assert rows[1] == {"stage": "denoising", "predicted": "1 min 40 s", "measured": "2 min 0 s",
                       "measured / predicted": "1.20"}
    assert rows[0]["measured"] == "-" and rows[0]["measured / predicted"] == "-"


def test_predicted_against_measured_adds_up_to_the_jobs_time_start_up_included():
    measured = {"load.transformer": 9.0, "denoise.denoise": 120.0, "decode.video": 30.0, "encode": 2.0,
                "denoise.prepare_latents": 1.0}
    rows = ev.predicted_vs_measured(FORECAST, measured, job_seconds=190.0)
    assert [r["stage"] for r in rows] == [
        "loading the transformer", "denoising", "decoding the video",
        "other stages (writing the video, preparing to denoise)",
        "the rest: starting the process, imports, between stages", "total"]
    assert [r["measured"] for r in rows] == ["9 s", "2 min 0 s", "30 s", "3 s", "28 s", "3 min 10 s"]
    assert rows[-1]["predicted"] == "2 min 20 s" and rows[-1]["measured / predicted"] == "1.36"
