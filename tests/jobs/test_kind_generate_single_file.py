"""A generate job whose DiT is a single file in the original layout, queued from `jobs submit generate
--transformer`, runs to the end on the worker and gives the frames of the same DiT from the model folder."""

from __future__ import annotations

import json

import pytest

from jobs.cli import main
from tests.models.reference_layout import reference_tensors, write_single_file


@pytest.mark.slow
def test_jobs_submit_generate_with_transformer_runs_and_matches_the_folder_s_dit(
        db, config, queue_job, run_to_end, tiny_model, capsys, launched_workers):
    file = write_single_file(reference_tensors(tiny_model / "transformer"), config.model_roots[0] / "dit.safetensors",
                             data_start_mod8=5)
    args = ["submit", "generate", "--model", str(tiny_model), "--prompt", "a red fox", "--height", "64", "--width",
            "64", "--steps", "2", "--no-audio", "--json"]
    assert main([*args, "--transformer", str(file)]) == 0, capsys.readouterr()
    single = json.loads(capsys.readouterr().out)["id"]
    folder = queue_job("generate", model=str(tiny_model),
                       generate={"prompt": "a red fox", "height": 64, "width": 64, "steps": 2, "audio": False})
    jobs = {name: run_to_end(job_id, timeout=300) for name, job_id in (("single", single), ("folder", folder))}
    assert [j["status"] for j in jobs.values()] == ["succeeded", "succeeded"], [j["error"] for j in jobs.values()]
    assert jobs["single"]["spec"]["generate"]["transformer"] == str(file)
    assert jobs["single"]["metrics"]["loads"]["transformer"]["tensors_placed"] == 52
    assert jobs["single"]["metrics"]["video_sha256"] == jobs["folder"]["metrics"]["video_sha256"]
