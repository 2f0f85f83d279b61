"""A LoRA on a generate job: checked and recorded at submit (resolved path, content hash, scale, partition), kept by
retry and by an edit, and a bad file refused in one line with nothing queued."""

import json

import pytest
import torch
from safetensors.torch import save_file

from jobs.cli import main
from jobs.queue import retry, submit
from jobs.spec import JobSpecError, build_spec
from storage import jobs_table
from storage.queries import get_job, list_jobs


@pytest.fixture
def lora(config, tiny_model):
    """A PEFT-layout LoRA on two Linears of the tiny DiT, under the model root."""
    path = config.model_roots[0] / "loras" / "style.safetensors"
    path.parent.mkdir()
    save_file({"transformer.transformer_blocks.0.attn.to_q.lora_A.weight": torch.ones(2, 32, dtype=torch.bfloat16),
               "transformer.transformer_blocks.0.attn.to_q.lora_B.weight": torch.ones(32, 2, dtype=torch.bfloat16)},
              path)
    return path


def test_submit_records_the_lora_and_retry_and_edit_keep_it(db, config, tiny_model, lora):
    import hashlib

    first = submit(db, {"kind": "generate", "model": str(tiny_model),
                        "generate": {"prompt": "a fox", "loras": [f"{lora}:0.8"]}}, config)
    [stored] = get_job(db, first)["spec"]["generate"]["loras"]
    assert stored == {"file": str(lora.resolve()), "scale": 0.8, "partition": "transformer",
                      "sha256": hashlib.sha256(lora.read_bytes()).hexdigest()}
    jobs_table.finish(db, first, "failed")
    again = retry(db, first, config)
    assert get_job(db, again)["spec"]["generate"]["loras"] == [stored]
    edited = retry(db, first, config, changes={"mode": "drain"})
    assert get_job(db, edited)["spec"]["generate"]["loras"] == [stored]


def test_a_lora_outside_the_model_roots_or_of_another_shape_is_refused_naming_it(config, tiny_model, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    save_file({"transformer.proj_in.lora_A.weight": torch.ones(2, 96), "transformer.proj_in.lora_B.weight":
               torch.ones(32, 2)}, outside)
    with pytest.raises(JobSpecError, match=r"generate.loras\[0\]: LoRA .*elsewhere.safetensors is outside the model roots"):
        build_spec({"kind": "generate", "model": str(tiny_model), "generate": {"prompt": "a", "loras": [str(outside)]}},
                   config)
    pruned = config.model_roots[0] / "pruned.safetensors"
    save_file({"transformer.proj_in.lora_A.weight": torch.ones(2, 80), "transformer.proj_in.lora_B.weight":
               torch.ones(32, 2)}, pruned)
    with pytest.raises(JobSpecError, match=r"pruned.safetensors: 'proj_in' has factors A \[2, 80\]"):
        build_spec({"kind": "generate", "model": str(tiny_model), "generate": {"prompt": "a", "loras": [str(pruned)]}},
                   config)


def test_jobs_submit_generate_takes_lora_and_refuses_a_bad_one_in_one_line_queueing_nothing(
        db, config, capsys, tiny_model, lora):
    not_lora = config.model_roots[0] / "dummy.safetensors"
    code = main(["submit", "generate", "--model", str(tiny_model), "--prompt", "a fox", "--lora", f"{not_lora}:0.5",
                 "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 2 and body["ok"] is False and list_jobs(db) == []
    [error] = [e for e in body["errors"] if e.startswith("generate.loras[0]")]
    assert "dummy.safetensors: holds no LoRA factors" in error and "\n" not in error
    assert main(["submit", "generate", "--model", str(tiny_model), "--prompt", "a fox", "--lora", str(lora),
                 "--lora", f"{lora}:-0.5", "--json"]) == 0
    [job] = list_jobs(db)
    assert [(x["scale"], x["partition"]) for x in get_job(db, job["id"])["spec"]["generate"]["loras"]] == [
        (1.0, "transformer"), (-0.5, "transformer")]
