"""A generate job's schedule: `--shift` at submit, recorded on the job; a bad shift refused before queueing."""

from __future__ import annotations

import json

import pytest

from jobs.cli import main
from jobs.spec import JobSpecError, build_spec
from storage.queries import list_jobs

pytestmark = pytest.mark.usefixtures("launched_workers")  # submits here start no real worker


def _submit(tiny_model, capsys, *extra: str) -> dict:
    code = main(["submit", "generate", "--model", str(tiny_model), "--prompt", "a fox", "--steps", "3", *extra,
                 "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 0, body
    return body


def test_submit_shift_is_recorded_on_the_job(db, config, capsys, tiny_model):
    _submit(tiny_model, capsys, "--shift", "5")
    [job] = list_jobs(db)
    assert job["spec"]["generate"]["shift"] == 5.0


@pytest.mark.parametrize("shift, message", [(0, "outside (0, 1000]"), ("fast", "must be a number"),
                                            (float("nan"), "must be a finite number")])
def test_a_bad_shift_is_refused_before_queueing(config, tiny_model, shift, message):
    with pytest.raises(JobSpecError) as caught:
        build_spec({"kind": "generate", "model": str(tiny_model), "generate": {"prompt": "a fox", "shift": shift}},
                   config)
    assert caught.value.field == "generate.shift" and message in str(caught.value)


def _stating_lora(config, tiny_model, name: str, metadata: dict[str, str]):
    from tests.models.lora_files import write_peft_lora

    folder = config.model_roots[0] / "loras"
    folder.mkdir(exist_ok=True)
    return write_peft_lora(folder / name, tiny_model, modules=["proj_out"], metadata=metadata)


def test_unset_steps_and_shift_take_the_loras_stated_ones_and_the_job_says_so(db, config, capsys, tiny_model):
    from dashboard.views.spec import generate_parameters

    plain = _stating_lora(config, tiny_model, "plain.safetensors", {})
    turbo = _stating_lora(config, tiny_model, "turbo.safetensors", {"num_inference_steps": "4", "shift": "5.0"})
    code = main(["submit", "generate", "--model", str(tiny_model), "--prompt", "a fox", "--lora", str(plain),
                 "--lora", str(turbo), "--json"])
    assert code == 0, capsys.readouterr().out
    [job] = list_jobs(db)
    assert (job["spec"]["generate"]["steps"], job["spec"]["generate"]["shift"]) == (4, 5.0)
    assert job["spec"]["schedule"] == {"steps": "LoRA turbo.safetensors", "shift": "LoRA turbo.safetensors"}
    shown = generate_parameters(job)
    assert shown["shift"] == "5 (stated by LoRA 'turbo.safetensors')" and "stated by LoRA" in shown["steps"]


def test_steps_and_shift_given_win_over_the_loras_and_unstated_ones_are_the_checkpoints(db, config, capsys,
                                                                                        tiny_model):
    turbo = _stating_lora(config, tiny_model, "turbo.safetensors", {"steps": "4", "flow_shift": "5"})
    plain = _stating_lora(config, tiny_model, "plain.safetensors", {"steps": "four"})
    main(["submit", "generate", "--model", str(tiny_model), "--prompt", "a fox", "--lora", str(turbo), "--steps", "6",
          "--shift", "2", "--json"])
    main(["submit", "generate", "--model", str(tiny_model), "--prompt", "a fox", "--lora", str(plain), "--json"])
    given, unstated = sorted(list_jobs(db), key=lambda j: j["id"])
    assert (given["spec"]["generate"]["steps"], given["spec"]["generate"]["shift"]) == (6, 2.0)
    assert given["spec"]["schedule"] == {"steps": "given", "shift": "given"}
    assert unstated["spec"]["generate"].get("steps") is None and unstated["spec"]["generate"].get("shift") is None
    assert unstated["spec"]["schedule"] == {"steps": "checkpoint", "shift": "checkpoint"}


def test_submit_preset_fills_steps_shift_and_its_lora_from_the_model_roots_and_the_job_records_it(
        db, config, capsys, tiny_model, tmp_path, monkeypatch):
    from models.request import presets

    presets_file = tmp_path / "presets.json"
    presets_file.write_text(json.dumps([{"name": "turbo", "steps": 4, "shift": 5.0, "lora": "turbo4.safetensors",
                                         "scale": 0.5}]))
    monkeypatch.setattr(presets, "PRESETS_FILE", presets_file)
    code = main(["submit", "generate", "--model", str(tiny_model), "--prompt", "a fox", "--preset", "turbo", "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 2 and any(e.startswith("preset: preset 'turbo': no LoRA file 'turbo4.safetensors' under "
                                          f"{config.model_roots[0]}") for e in body["errors"]), body
    lora = _stating_lora(config, tiny_model, "turbo4.safetensors", {})
    _submit(tiny_model, capsys, "--preset", "turbo", "--shift", "3")  # --steps 3 given, so is --shift
    main(["submit", "generate", "--model", str(tiny_model), "--prompt", "a fox", "--preset", "turbo", "--json"])
    given, filled = sorted(list_jobs(db), key=lambda j: j["id"])
    assert (given["spec"]["generate"]["steps"], given["spec"]["generate"]["shift"]) == (3, 3.0)
    assert (filled["spec"]["generate"]["steps"], filled["spec"]["generate"]["shift"]) == (4, 5.0)
    assert [(x["file"], x["scale"]) for x in filled["spec"]["generate"]["loras"]] == [(str(lora), 0.5)]
    assert filled["spec"]["preset"] == "turbo"
