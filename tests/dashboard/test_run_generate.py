"""The Run page's generate options under AppTest, on the `tiny` profile: the VAE and DiT knobs under the spec's
own names, what each costs said beside it, the stage plan, the fit bar that reads the submit check's numbers,
and a load job's skeleton switch."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("tiny") / "tiny"
    subprocess.run([sys.executable, "-m", "models", "synth", str(target), "--profile", "tiny"], cwd=ROOT, check=True,
                   capture_output=True)
    return target


@pytest.fixture
def tiny_root(fresh_db, data_dir, tiny_source) -> Path:
    """The tiny H3 root under the model root, alone there (so it is the picker's default)."""
    target = data_dir / "models" / "tiny"
    shutil.copytree(tiny_source, target)
    return target


def generate_page() -> AppTest:
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "run.py"), default_timeout=TIMEOUT)
    at.query_params["kind"] = "generate"
    return at.run()


def _queued(db) -> list[dict]:
    return [json.loads(row[0]) for row in db.execute("SELECT spec FROM jobs ORDER BY id").fetchall()]


def _plan(at: AppTest):
    return next(d.value for d in at.dataframe if "resident" in d.value.columns)


def test_the_vae_and_dit_knobs_queue_under_the_specs_own_names_and_come_back_on_edit(tiny_root, fresh_db):
    at = generate_page()
    assert not at.exception, at.exception
    assert at.toggle(key="run_gen_vae_tiling").value is True  # the defaults: tiled, bf16, not quantized
    assert at.selectbox(key="run_gen_vae_dtype").value == "bf16"
    assert at.selectbox(key="run_gen_quantize").value == "none"
    assert list(at.selectbox(key="run_gen_vae_dtype").options) == ["bf16", "fp32"]
    at.toggle(key="run_gen_vae_tiling").set_value(False).run()
    assert any("36.4 dB tiled against 21.5 dB untiled" in w.value for w in at.warning)
    at.selectbox(key="run_gen_vae_dtype").set_value("fp32").run()
    assert any("3.8x the seconds" in c.value for c in at.caption)
    at.selectbox(key="run_gen_quantize").set_value("int8").run()
    assert any("not bit-identical" in i.value for i in at.info)
    assert "transformer (int8 weights)" in set(_plan(at)["resident"])
    at.button(key="run_submit").click().run()
    [spec] = _queued(fresh_db)
    assert {k: spec["generate"][k] for k in ("vae_tiling", "vae_dtype", "quantize")} == \
        {"vae_tiling": False, "vae_dtype": "fp32", "quantize": "int8"}

    again = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "run.py"), default_timeout=TIMEOUT)
    again.query_params["from"] = "1"
    again.run()
    assert not again.exception, again.exception
    assert again.toggle(key="run_gen_vae_tiling").value is False
    assert again.selectbox(key="run_gen_vae_dtype").value == "fp32"
    assert again.selectbox(key="run_gen_quantize").value == "int8"


def test_fp8_on_the_cpu_says_why_the_job_would_fail(tiny_root):
    at = generate_page()
    assert not any("compute capability" in e.value for e in at.error)
    at.selectbox(key="run_gen_quantize").set_value("fp8").run()
    assert any("fp8 needs a CUDA GPU of compute capability 8.9 or newer; cpu has no CUDA" in e.value for e in at.error)


def test_a_missing_torchao_is_named_with_the_command_that_installs_it():
    from models.quantization.check import quantization_problem

    assert "pip install -r requirements-quant.txt" in quantization_problem("int8", "cpu", None, torchao=False)
    assert quantization_problem("int8", "cpu", None, torchao=True) is None
    assert quantization_problem("fp8", "cuda:0", (9, 0), torchao=True) is None  # an H100 / H200
    assert "has compute capability 8.0" in quantization_problem("fp8", "cuda:0", (8, 0), torchao=True)  # an A100


def test_the_stage_plan_follows_the_one_component_at_a_time_choice(tiny_root):
    at = generate_page()
    at.selectbox(key="run_sequential_components").set_value("on").run()
    plan = _plan(at)
    assert list(plan["stage"]) == ["encoding the prompt", "denoising", "decoding the video", "decoding the audio"]
    assert list(plan["resident"]) == ["text encoder", "transformer", "video decoder", "audio decoder"]
    at.selectbox(key="run_sequential_components").set_value("off").run()
    plan = _plan(at)
    assert plan["resident"].iloc[1] == "text encoder, transformer, video decoder, audio decoder"
    assert any("every component resident" in e.label for e in at.expander)


def test_the_generate_fit_bar_reads_the_submit_checks_numbers_word_for_word(tiny_root, fresh_db):
    from tests.dashboard.test_run_page import chart_labels

    at = generate_page()
    # No job has run here: the process is not counted yet, and the page never says "Fits" for it.
    assert not any(s.value.startswith("Fits") for s in at.success)
    assert any(w.value.startswith("Fits only if its process is small: the stages alone need ") and
               "no history of a job's own process yet" in w.value for w in at.warning)
    at.text_input(key="run_memory_budget").input("1MiB").run()
    said = next(e.value for e in at.error if e.value.startswith("Will not fit"))
    assert re.fullmatch(r"Will not fit: needs [\d.]+ MiB, over the 1\.0 MiB budget: set the budget to at least "
                        r"that, or tick \*Queue anyway\*\.", said), said
    assert "budget 1 MiB" in chart_labels(at)  # as typed, like a load's bar
    at.button(key="run_submit").click().run()
    assert _queued(fresh_db) == []


def test_a_load_job_offers_the_skeleton_switch_and_queues_it(tiny_root, fresh_db):
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "run.py"), default_timeout=TIMEOUT).run()
    assert at.checkbox(key="run_skeleton").value is False
    at.checkbox(key="run_skeleton").check().run()
    at.button(key="run_submit").click().run()
    assert not at.exception, at.exception
    [spec] = _queued(fresh_db)
    assert spec["kind"] == "load" and spec["skeleton"] is True
    at.segmented_control(key="run_kind").set_value("generate").run()
    assert not at.get("checkbox") or all(c.key != "run_skeleton" for c in at.checkbox)


def test_the_speed_levers_are_named_lossless_or_lossy_refused_as_submit_would_and_queued(tiny_root, fresh_db):
    at = generate_page()
    assert at.selectbox(key="run_gen_attention").value == "native" and at.toggle(key="run_gen_compile").value is False
    assert at.selectbox(key="run_gen_step_cache").value == "none"
    at.selectbox(key="run_gen_attention").set_value("_native_cudnn").run()
    assert any("cuDNN attention runs on CUDA only, not on cpu" in e.value for e in at.error)
    at.selectbox(key="run_gen_step_cache").set_value("first-block").run()
    assert any("the first-block cache is unavailable for MiniMax H3" in e.value for e in at.error)
    assert any("quality cost cannot be judged" in i.value for i in at.info)
    at.selectbox(key="run_gen_attention").set_value("_native_flash").run()
    at.selectbox(key="run_gen_step_cache").set_value("taylorseer").run()
    at.toggle(key="run_gen_compile").set_value(True).run()
    assert at.toggle(key="run_gen_vae_compile").value is False
    at.toggle(key="run_gen_vae_compile").set_value(True).run()
    assert not at.error
    # The forecast cannot know a compile's workspace, and the verdict beside it says so.
    assert any("Not counted: compile: the compiled blocks' workspace" in c.value and "vae_compile: the compiled decoder"
               in c.value for c in at.caption)
    labels = at.selectbox(key="run_gen_step_cache")
    assert labels.format_func("taylorseer") == "TaylorSeer step cache · lossy"
    assert at.selectbox(key="run_gen_attention").format_func("_native_flash") == "flash attention (torch) · lossless"
    at.button(key="run_submit").click().run()
    [spec] = _queued(fresh_db)
    assert {k: spec["generate"][k] for k in ("attention", "compile", "step_cache", "vae_compile")} == \
        {"attention": "_native_flash", "compile": True, "step_cache": "taylorseer", "vae_compile": True}


def test_the_plan_table_marks_the_chosen_candidate_strikes_what_cannot_fit_and_the_job_records_it(tiny_root,
                                                                                                  fresh_db):
    at = generate_page()
    assert at.checkbox(key="run_plan_lossy").disabled
    at.toggle(key="run_plan").set_value(True).run()
    assert not at.exception, at.exception
    table = next(m.value for m in at.markdown if m.value.startswith("| "))
    rows = [r for r in table.splitlines()[2:]]
    # 2 residencies x 2 backends x the DiT's compile x the VAE decoder's
    assert len(rows) == 16 and sum(r.startswith("| → |") for r in rows) == 1
    assert "no history on this machine" in table and "(lossy)" not in table and " under the " in table
    assert any(c.value.startswith("Runs resident · bf16 · no lever: no history") for c in at.caption)
    assert any(c.value == "Seconds include each lever's start-up (the compiles' first calls, their own stages); walls: "
               "the process start-up is not counted: no history on this machine." for c in at.caption)
    at.button(key="run_submit").click().run()
    [spec] = _queued(fresh_db)
    assert spec["plan"] == "fastest" and spec["planned"]["chosen"] == 0
    assert spec["generate"]["compile"] is False and spec["sequential_components"] is False

    at = generate_page()
    at.toggle(key="run_plan").set_value(True).run()
    at.text_input(key="run_memory_budget").input("1MiB").run()
    table = next(m.value for m in at.markdown if m.value.startswith("| "))
    assert all(r.count("~~") >= 2 and "text_encoder would peak at" in r and "does not fit (text_encoder)" in r
               for r in table.splitlines()[2:])
    assert any(e.value.startswith("Refused: needs ") and "over the 1.0 MiB budget (none of the 16 candidates" in e.value
               for e in at.error)


def test_fields_are_checked_as_they_change_named_as_the_form_names_them_and_cleared_once_fixed(tiny_root, fresh_db):
    at = generate_page()
    assert at.button(key="run_submit").disabled is False and not at.error
    assert not [s for s in at.selectbox if s.label == "Component to load"]  # a generate loads every component
    at.number_input(key="run_gen_width").set_value(100).run()  # not a multiple of the checkpoint's 32
    under_width = [e.value for e in at.error]
    assert len(under_width) == 1 and "multiple of" in under_width[0]
    submit = at.button(key="run_submit")
    assert submit.disabled and submit.help.startswith("Fix first: Width: ")
    shown = " ".join([e.value for e in at.error] + [c.value for c in at.caption] + [submit.help])
    assert "generate." not in shown  # the form's own names, never the spec's
    at.number_input(key="run_gen_width").set_value(128).run()
    assert not at.error and at.button(key="run_submit").disabled is False
    at.button(key="run_submit").click().run()
    assert _queued(fresh_db)[0]["generate"]["width"] == 128


def test_a_load_offers_the_component_a_generate_does_not(tiny_root, fresh_db):
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "run.py"), default_timeout=TIMEOUT).run()
    assert [s.label for s in at.selectbox if s.label == "Component to load"] == ["Component to load"]


def test_a_drainboard_video_dropped_on_the_run_page_fills_the_form(tiny_root, fresh_db, tmp_path):
    import numpy as np

    from models.video.encode import write_mp4
    from models.request.params import GenerateParams
    from models.video.settings import video_settings

    params = GenerateParams(prompt="a heron over a misty lake", seed=42, steps=5, frames=141, width=128, height=96)
    clip = tmp_path / "made.mp4"
    write_mp4(clip, np.zeros((3, 32, 48, 3), np.uint8), 24, comment=json.dumps(video_settings(params, tiny_root)))
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "run.py"), default_timeout=TIMEOUT).run()
    assert at.segmented_control(key="run_kind").value == "load"
    at.get("file_uploader")[0].set_value(("made.mp4", clip.read_bytes(), "video/mp4")).run()
    assert not at.exception, at.exception
    assert at.segmented_control(key="run_kind").value == "generate"
    assert at.text_area(key="run_gen_prompt").value == "a heron over a misty lake"
    assert (at.number_input(key="run_gen_seed").value, at.number_input(key="run_gen_steps").value,
            at.number_input(key="run_gen_frames").value, at.number_input(key="run_gen_width").value) == (42, 5, 141, 128)
    assert any(s.value.startswith("Filled from the video's settings") and "checkpoint tiny" in s.value for s in at.success)
    at.text_area(key="run_gen_prompt").set_value("my own edit").run()  # applied once: the user's edits stay
    assert at.text_area(key="run_gen_prompt").value == "my own edit"


def test_a_video_without_settings_is_said_and_changes_nothing(tiny_root, fresh_db, tmp_path):
    import numpy as np

    from models.video.encode import write_mp4

    clip = tmp_path / "plain.mp4"
    write_mp4(clip, np.zeros((3, 32, 48, 3), np.uint8), 24)
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "run.py"), default_timeout=TIMEOUT).run()
    at.get("file_uploader")[0].set_value(("plain.mp4", clip.read_bytes(), "video/mp4")).run()
    assert any("carries no Drainboard settings" in w.value for w in at.warning)
    assert at.segmented_control(key="run_kind").value == "load"


def test_the_offload_preview_shows_what_a_discrete_gpu_generate_will_do_not_the_plain_policy(tiny_source):
    from jobs.probe import job_offload
    from jobs.spec import JobSpec
    from machine.device import DeviceInfo
    from machine.offload import OffloadSettings
    from jobs.kinds.generate import GenerateJobOptions
    from models.request.params import GenerateParams
    from dashboard.views.run import offload_preview, offload_summary

    gpu = DeviceInfo(spec="cuda:0", kind="cuda", index=0, name="a discrete 80 GiB GPU", unified_memory=False,
                     total_memory=80 * 2**30, source="test", reason="a discrete GPU")
    spec = JobSpec(kind="generate", model=str(tiny_source), device="cuda:0",
                   options=GenerateJobOptions(generate=GenerateParams(prompt="a fox", steps=2, frames=124)))
    plain = offload_preview(OffloadSettings(), gpu)
    job = offload_preview(OffloadSettings(), gpu, decided=job_offload(spec, gpu))
    assert plain["used"].sum() == 3  # the plain policy offloads every component (layerwise in place of whole-DiT)
    assert not job["used"].any()  # the tiny model fits 80 GiB: the job keeps every component on the GPU
    assert offload_summary(job, gpu).startswith("Offload on cuda:0: 4 of 4 settings follow this job's forecast")


def test_gpus_for_one_clip_are_refused_as_submit_refuses_them_queued_and_come_back_on_edit(
        tiny_root, fresh_db, monkeypatch):
    import torch

    at = generate_page()
    assert at.number_input(key="run_gen_parallel").value == 1
    at.number_input(key="run_gen_parallel").set_value(2).run()
    assert any("needs an accelerator" in e.value for e in at.error)  # a CPU-only torch: diffusers cannot place ranks
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 1)  # as tests/fake_accelerator does
    at.run()
    assert not any("needs an accelerator" in e.value for e in at.error)
    at.button(key="run_submit").click().run()
    [spec] = _queued(fresh_db)
    assert spec["generate"]["parallel"] == 2

    again = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "run.py"), default_timeout=TIMEOUT)
    again.query_params["from"] = "1"
    again.run()
    assert again.number_input(key="run_gen_parallel").value == 2


def test_the_shift_is_unset_by_default_queued_when_given_and_shown_on_the_job(tiny_root, fresh_db):
    from dashboard.views.spec import generate_parameters

    at = generate_page()
    assert at.number_input(key="run_gen_shift").value is None
    at.button(key="run_submit").click().run()
    at.number_input(key="run_gen_shift").set_value(5.0).run()
    at.button(key="run_submit").click().run()
    unset, given = _queued(fresh_db)
    assert "shift" not in unset["generate"] or unset["generate"]["shift"] is None
    assert given["generate"]["shift"] == 5.0
    assert generate_parameters({"spec": given})["shift"] == "5"
    assert generate_parameters({"spec": unset})["shift"] == "the scheduler config's"


def test_a_preset_fills_steps_shift_and_its_lora_and_a_missing_lora_is_said(tiny_root, fresh_db, monkeypatch, tmp_path):
    from models.request import presets
    from tests.models.lora_files import write_peft_lora

    presets_file = tmp_path / "presets.json"
    presets_file.write_text(json.dumps([{"name": "turbo", "steps": 4, "shift": 5.0, "lora": "turbo4.safetensors",
                                         "scale": 0.5, "source": "a test's own figures"}]))
    monkeypatch.setattr(presets, "PRESETS_FILE", presets_file)
    at = generate_page()
    at.selectbox(key="run_gen_preset").set_value("turbo").run()
    assert any("no LoRA file 'turbo4.safetensors' under" in e.value for e in at.error)
    assert (at.number_input(key="run_gen_steps").value, at.number_input(key="run_gen_shift").value) == (4, 5.0)
    lora = write_peft_lora(tiny_root.parent / "turbo4.safetensors", tiny_root, modules=["proj_out"])
    at.selectbox(key="run_gen_preset").set_value("none").run()
    at.selectbox(key="run_gen_preset").set_value("turbo").run()
    assert not at.exception, at.exception
    assert at.multiselect(key="run_gen_loras").value == [str(lora)]
    assert any("a test's own figures" in c.value for c in at.caption)
    at.button(key="run_submit").click().run()
    [spec] = _queued(fresh_db)
    assert (spec["generate"]["steps"], spec["generate"]["shift"]) == (4, 5.0)
    assert [(x["file"], x["scale"]) for x in spec["generate"]["loras"]] == [(str(lora), 0.5)]


def test_a_picked_lora_the_submit_check_refuses_is_said_in_one_line_and_the_job_cannot_be_queued(
        tiny_root, fresh_db):
    import torch
    from safetensors.torch import save_file

    pruned = tiny_root.parent / "loras" / "pruned-style.safetensors"  # offered (it holds LoRA factors), not for this DiT
    pruned.parent.mkdir()
    save_file({"transformer.proj_in.lora_A.weight": torch.ones(2, 80),
               "transformer.proj_in.lora_B.weight": torch.ones(32, 2)}, str(pruned))
    at = generate_page()
    assert at.selectbox(key="run_checkpoint").value == str(tiny_root)  # the model folder, not the folder of LoRAs
    at.multiselect(key="run_gen_loras").set_value([str(pruned)]).run()
    assert not at.exception, at.exception
    [error] = [e.value for e in at.error if "pruned-style.safetensors" in e.value]  # the page runs the submit check
    assert "has factors A [2, 80] and B [32, 2] but transformer's weight is" in error and "\n" not in error
    assert at.button(key="run_submit").disabled and _queued(fresh_db) == []
