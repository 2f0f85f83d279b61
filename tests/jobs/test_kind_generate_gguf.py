"""A generate job whose DiT is a GGUF file, queued from `jobs submit generate --transformer FILE.gguf`, runs to
the end on the worker with the DiT quantized, holding the bytes the forecast counts."""

from __future__ import annotations

import json

import pytest

from jobs.cli import main
from models.forecast import weight_bytes
from tests.loader.gguf_files import require_gguf
from tests.models.reference_layout import reference_tensors, write_gguf


@pytest.mark.slow
def test_jobs_submit_generate_with_a_gguf_transformer_runs_quantized(db, config, run_to_end, tiny_model, capsys,
                                                                     launched_workers):
    require_gguf()
    file = write_gguf(reference_tensors(tiny_model / "transformer"), config.model_roots[0] / "dit-Q8_0.gguf")
    args = ["submit", "generate", "--model", str(tiny_model), "--prompt", "a red fox", "--height", "64", "--width",
            "64", "--steps", "2", "--no-audio", "--json"]
    assert main([*args, "--transformer", str(file)]) == 0, capsys.readouterr()
    job = run_to_end(json.loads(capsys.readouterr().out)["id"], timeout=300)
    assert job["status"] == "succeeded", job["error"]
    load = job["metrics"]["loads"]["transformer"]
    assert load["mode"] == "diffusers-gguf" and load["tensors_placed"] == 46
    assert load["bytes_placed"] == weight_bytes(tiny_model, transformer=str(file))["transformer"]
    assert main([*args, "--transformer", str(file), "--quantize", "int8"]) == 2
    assert "quantize: a GGUF DiT is quantized already" in json.loads(capsys.readouterr().out)["error"]
