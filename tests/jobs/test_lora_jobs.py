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


def _hostile(folder, case: str):
    """A file under the model root that is no usable LoRA, and what its refusal says was found."""
    import os
    import struct

    good = {"transformer.proj_in.lora_A.weight": torch.ones(2, 96), "transformer.proj_in.lora_B.weight": torch.ones(32, 2)}
    path = folder / f"{case}.safetensors"
    if case == "truncated-data":  # the header is whole, the last factor's bytes are not
        save_file(good, path)
        path.write_bytes(path.read_bytes()[:-100])
        return path, "past the end of the 924-byte data area (truncated?)"
    if case == "truncated-header":
        save_file(good, path)
        path.write_bytes(path.read_bytes()[:40])
        return path, "header length runs past the end of the 40-byte file (truncated?)"
    if case == "header-not-json":
        path.write_bytes(struct.pack("<Q", 8) + b"{nojson}")
        return path, "header is not valid JSON"
    if case == "pickle-named-safetensors":
        path.write_bytes(b"\x80\x04\x95" + b"\0" * 64)
        return path, "not a readable safetensors file"
    if case == "pickle":
        path = folder / "old.ckpt"
        path.write_bytes(b"\x80\x04\x95" + b"\0" * 64)
        return path, "not a .safetensors file (only safetensors LoRAs are read; nothing is unpickled)"
    if case == "oversized":
        with open(path, "wb") as f:
            f.truncate(16 * 2**30 + 1)  # sparse: no disk used, and nothing past its size is read
        return path, "17,179,869,185 bytes, more than the 17,179,869,184 a LoRA may be"
    if case == "link-out-of-the-roots":
        outside = folder.parent.parent.parent / "outside.safetensors"
        save_file(good, outside)
        os.symlink(outside, path)
        return path, "is outside the model roots"
    if case == "no-lora":
        save_file({"proj_in.weight": torch.ones(32, 96)}, path)
        return path, "holds no LoRA factors"
    if case == "targets-no-module":
        save_file({"text_model.q.lora_A.weight": torch.ones(2, 16), "text_model.q.lora_B.weight": torch.ones(16, 2)}, path)
        return path, "targets no module"
    if case == "pruned":
        save_file({"transformer.proj_in.lora_A.weight": torch.ones(2, 80), "transformer.proj_in.lora_B.weight":
                   torch.ones(32, 2)}, path)
        return path, "has factors A [2, 80] and B [32, 2] but transformer's weight is [32, 96]"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["truncated-data", "truncated-header", "header-not-json", "pickle-named-safetensors",
                                  "pickle", "oversized", "link-out-of-the-roots", "no-lora", "targets-no-module",
                                  "pruned"])
def test_a_hostile_lora_file_is_refused_at_submit_in_one_line_naming_it_and_nothing_is_queued(
        db, config, capsys, tiny_model, lora, case):
    path, found = _hostile(lora.parent, case)
    code = main(["submit", "generate", "--model", str(tiny_model), "--prompt", "a fox", "--lora", str(lora),
                 "--lora", f"{path}:0.5", "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 2 and body["ok"] is False and list_jobs(db) == []
    [error] = [e for e in body["errors"] if e.startswith("generate.loras[1]")]
    assert path.name in error and found in error and "\n" not in error
    assert not [e for e in body["errors"] if e.startswith("generate.loras[0]")]  # the good LoRA beside it is not blamed


def test_a_lora_jobs_load_eta_is_learned_from_finished_jobs_of_its_lora_set_only(db, config, tiny_model, lora):
    from jobs.history import stage_records
    from models.lora.inputs import lora_key

    def queue(**generate):
        return submit(db, {"kind": "generate", "model": str(tiny_model), "generate": {"prompt": "a fox", **generate}},
                      config)

    styled, plain = queue(loras=[str(lora)]), queue()
    for job_id, seconds in ((styled, 9.0), (plain, 1.0)):
        work = get_job(db, job_id)["spec"]["forecast"]["work"]
        jobs_table.set_metrics(db, job_id, {"stage_seconds": dict.fromkeys(work, seconds)})
        jobs_table.finish(db, job_id, "succeeded")
    key = lora_key(get_job(db, styled)["spec"]["generate"])
    assert key and {r.loras for r in stage_records(db) if r.stage == "load.transformer"} == {key, ""}

    def load_eta(job_id):
        return next(e for e in get_job(db, job_id)["spec"]["forecast"]["eta"] if e["stage"] == "load.transformer")

    assert load_eta(queue(loras=[f"{lora}:0.5"]))["seconds"] == 9.0  # the same file at another scale: its set
    assert load_eta(queue())["seconds"] == 1.0  # a plain load borrows nothing from the merging one
