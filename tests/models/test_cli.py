"""`python -m models`: one JSON object on stdout with --json, exit 2 with the error shape on bad input."""

from __future__ import annotations

import json
from pathlib import Path

from models.cli import build_parser, main


def test_synth_dry_run_json_prints_the_pruned_dit_counts(capsys, tmp_path: Path):
    assert main(["synth", str(tmp_path / "h3"), "--profile", "h3-pruned-r16", "--dry-run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [dit] = [c for c in report["components"] if c["name"] == "transformer"]
    assert (dit["tensors"], dit["parameters"], dit["bytes"]) == (639, 20_166_101_760, 40_332_203_520)
    assert not (tmp_path / "h3").exists()


def test_generate_with_bad_params_exits_2_with_the_error_shape(capsys, h3_tiny: Path, tmp_path: Path):
    code = main(["generate", str(h3_tiny), "--prompt", "fox", "--out", str(tmp_path / "c.mp4"),
                 "--frames", "10", "--width", "100", "--height", "64", "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 2 and body["ok"] is False
    assert body["errors"] == [
        "frames: 10 is not 17n + 5 within 5-15 s at 24 fps (124..345, e.g. 124, 141 or 345)",
        "width: 100 is not a positive multiple of 32 (VAE 16x spatial compression x patch 2)",
    ]


def test_generate_writes_the_clip_and_prints_the_result_as_json(capsys, h3_tiny: Path, tmp_path: Path):
    out = tmp_path / "clip.mp4"
    code = main(["generate", str(h3_tiny), "--prompt", "a red fox", "--out", str(out), "--width", "64",
                 "--height", "64", "--steps", "2", "--no-audio", "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 0 and body["out_path"] == str(out) and out.stat().st_size > 0
    assert (body["frames"], body["width"], body["height"], body["steps"]) == (124, 64, 64, 1)


def test_every_command_has_help_with_an_example():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        assert "example: python -m models " + name in parser.format_help()


def test_forecast_json_prints_each_stage_s_host_device_sum_and_seconds_and_the_job_s_peak(capsys, h3_tiny: Path,
                                                                                        tmp_path: Path):
    history = tmp_path / "history.json"
    history.write_text(json.dumps([{"stage": "text_encoder", "seconds": 2.0, "work": 1.0, "device": "cpu:x"}]))
    code = main(["forecast", str(h3_tiny), "--prompt", "a red fox", "--frames", "141", "--height", "96",
                 "--width", "160", "--steps", "4", "--history", str(history), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"] is True and out["text_tokens"] > 0
    assert [s["stage"] for s in out["stages"]] == ["text_encoder", "denoise.denoise", "decode.video", "decode.audio"]
    for s in out["stages"]:
        assert s["sum_bytes"] == s["host_bytes"] + s["device_bytes"] > 0
        assert s["seconds"] is None and s["seconds_basis"] == "no history on this machine"  # another device's
    assert out["peak_bytes"] == max(s["sum_bytes"] for s in out["stages"]) and out["total_seconds"] is None


def test_forecast_bad_input_exits_2_in_one_line(capsys, h3_tiny: Path, tmp_path: Path):
    assert main(["forecast", str(h3_tiny), "--prompt", "x", "--frames", "7", "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["error"].startswith("frames: 7 is not 17n + 5")
    (tmp_path / "bad.json").write_text("{")
    assert main(["forecast", str(h3_tiny), "--prompt", "x", "--history", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {tmp_path / 'bad.json'}: expected a JSON list")


def test_generate_fl2va_from_the_command_line_and_a_bad_image_exits_2(capsys, h3_tiny: Path, tmp_path: Path):
    from PIL import Image

    frame = tmp_path / "frame.png"
    Image.new("RGB", (64, 64), (10, 200, 10)).save(frame)
    out = tmp_path / "clip.mp4"
    code = main(["generate", str(h3_tiny), "--prompt", "a red fox", "--out", str(out), "--width", "64",
                 "--height", "64", "--steps", "2", "--no-audio", "--workflow", "fl2va", "--image", str(frame),
                 "--no-vae-tiling", "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 0 and body["workflow"] == "fl2va" and body["vae_tiling"] is False
    assert body["inputs"]["image"] == {"file": "frame.png", "size": [64, 64], "note": ""}  # canvas-sized: no resize
    bad = tmp_path / "bad.webp"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WEBPVP8 junk")
    code = main(["generate", str(h3_tiny), "--prompt", "fox", "--out", str(out), "--ref-image", str(bad), "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 2 and len(body["errors"]) == 1 and body["errors"][0].startswith(f"ref_image: {bad}: ")


def test_generate_with_a_clip_that_is_no_video_exits_2_naming_it(capsys, h3_tiny: Path, tmp_path: Path):
    bad = tmp_path / "motion.mp4"
    bad.write_text("not a video")
    code = main(["generate", str(h3_tiny), "--prompt", "fox", "--out", str(tmp_path / "c.mp4"), "--ref-video", str(bad),
                 "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 2 and len(body["errors"]) == 1
    assert body["errors"][0].startswith(f"ref_video: {bad}: not a readable video")


def test_forecast_plan_fastest_prints_the_plan_and_forecasts_its_choice(capsys, h3_tiny: Path):
    code = main(["forecast", str(h3_tiny), "--prompt", "a red fox", "--height", "64", "--width", "64", "--steps", "4",
                 "--plan", "fastest", "--json"])
    captured = capsys.readouterr()
    body = json.loads(captured.out)
    plan = body["plan"]
    chosen = plan["candidates"][plan["chosen"]]
    assert code == 0 and len(plan["candidates"]) == 16 and all(c["lossless"] for c in plan["candidates"])
    assert body["sequential_components"] is chosen["sequential"] and body["levers"] == chosen["levers"]
    assert captured.err.splitlines()[0] == (
        "plan: 16 candidates (lossless only); seconds include each lever's start-up (the compiles' first calls, their"
        " own stages); walls: the process start-up is not counted: no history on this machine")


def test_generate_and_forecast_plan_count_the_learned_process_start_up_and_refuse_in_the_verdict_s_words(
        capsys, h3_tiny: Path, tmp_path: Path):
    from core.sizes import format_size
    from machine.device import probe_device
    from models.forecast.eta import device_key

    cpu = probe_device("cpu")
    history = tmp_path / "history.json"  # one past job whose process grew by 1 PiB before its first weight
    history.write_text(json.dumps([{"kind": "generate", "device": device_key(cpu.kind, cpu.name),
                                    "ready_bytes": 2**30, "startup_bytes": 2**50}]))
    request = [str(h3_tiny), "--prompt", "a red fox", "--height", "64", "--width", "64", "--steps", "4",
               "--plan", "fastest", "--history", str(history), "--json"]
    for command in (["generate", *request[:1], "--out", str(tmp_path / "c.mp4"), *request[1:]], ["forecast", *request]):
        code = main(command)
        captured = capsys.readouterr()
        body = json.loads(captured.out)
        assert code == 2 and body["error"].startswith("refused: needs 104857") and \
            "MemAvailable (none of the 16 candidates of --plan fastest fits; the first in the order of preference:" \
            in body["error"]
        assert captured.err.splitlines()[0].endswith(
            f"walls: each counts the process start-up, {format_size(2**50)} (median of 1 past job)")
    assert not (tmp_path / "c.mp4").exists()


def test_generate_plan_fastest_runs_the_candidate_its_history_times_fastest(capsys, h3_tiny: Path, tmp_path: Path):
    from dataclasses import asdict

    from machine.device import probe_device
    from machine.offload import OffloadSettings
    from models.forecast.eta import StageRecord, device_key, stage_work
    from models.forecast import forecast_generate
    from models.request.params import GenerateParams

    cpu = probe_device("cpu")
    size = {"height": 64, "width": 64, "steps": 2, "audio": False}
    records = []
    for key, rate in (("", 1e-6), ("attention=_native_flash", 5e-7)):  # flash attention: half the seconds
        levers = {"attention": "_native_flash"} if key else {}
        forecast = forecast_generate(h3_tiny, GenerateParams(prompt="a red fox", **size, **levers), device_info=cpu,
                                     settings=OffloadSettings())
        records += [asdict(StageRecord(stage, work * rate, work, device_key(cpu.kind, cpu.name), key))
                    for stage, work in stage_work(forecast).items()]
    history = tmp_path / "history.json"
    history.write_text(json.dumps(records))
    out = tmp_path / "clip.mp4"
    code = main(["generate", str(h3_tiny), "--prompt", "a red fox", "--out", str(out), "--width", "64", "--height",
                 "64", "--steps", "2", "--no-audio", "--plan", "fastest", "--history", str(history), "--json"])
    captured = capsys.readouterr()
    body = json.loads(captured.out)
    assert code == 0 and out.stat().st_size > 0
    assert " * resident · bf16 · flash attention (torch): peak " in captured.err
    assert body["levers"]["attention"] == "_native_flash" and body["sequential_components"] is False
