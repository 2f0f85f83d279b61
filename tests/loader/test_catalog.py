"""`python -m loader models`: every checkpoint under the folders and the Hugging Face cache, from headers."""

from __future__ import annotations

import json
from pathlib import Path

from loader.catalog import find_models, fit_verdict
from loader.cli import main
from tests.hub_layout import hub_snapshot


def test_the_verdict_weighs_all_weights_then_the_largest_alone():
    sizes = {"text_encoder": 6, "transformer": 4, "vae": 1}
    assert fit_verdict(sizes, 11) == "fits"
    assert fit_verdict(sizes, 10) == "needs sequential residency"
    assert fit_verdict(sizes, 5) == "does not fit: text_encoder"


def test_layouts_sizes_and_dtypes_of_what_lies_under_a_folder_and_the_cache(tiny_checkpoint, tmp_path, capsys,
                                                                            monkeypatch):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "tiny").symlink_to(tiny_checkpoint.path, target_is_directory=True)  # a link out: not listed
    hub_snapshot(tiny_checkpoint.path, tmp_path / "hub", repo_id="org/tiny")
    (folder / "bad.safetensors").write_bytes(b"\x00" * 4)
    entries = find_models([folder, tmp_path / "hub"], memory=2**40)
    assert [(e.name, e.layout, e.verdict) for e in entries] == [
        ("bad.safetensors", "single file", ""), ("org/tiny @ main", "component folder", "fits")]
    assert entries[0].problems and not entries[1].problems
    [component] = entries[1].components
    assert component.dtypes == {"BF16": 768, "F16": 1024, "F32": 384, "I64": 24}
    assert component.run_bytes == 768 + 1024 + 192 + 24  # floats at bf16, the step table as stored
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["models", str(folder), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["folders"] == [str(folder), str(tmp_path / "hub")]
    assert [m["name"] for m in listed["models"]] == ["bad.safetensors", "org/tiny @ main"]
    assert main(["models", str(folder), "--no-hub-cache"]) == 0
    assert "org/tiny" not in capsys.readouterr().out


def test_the_listing_reads_headers_only_and_runs_no_validation(tiny_checkpoint, tmp_path, monkeypatch):
    """Per-tensor description and validation are what made a listing of 50 checkpoints slow: the listing
    sums each header per dtype instead. The counters are live: the submit check goes through both."""
    import loader.checkpoint as checkpoint
    import loader.safetensors_file as safetensors_file

    calls = {"validate": 0, "entries": 0}

    def counted(name, real):
        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(checkpoint, "validate_checkpoint", counted("validate", checkpoint.validate_checkpoint))
    monkeypatch.setattr(safetensors_file, "_parse_entry", counted("entries", safetensors_file._parse_entry))
    hub_snapshot(tiny_checkpoint.path, tmp_path / "hub", repo_id="org/tiny")
    [entry] = find_models([tmp_path / "hub"], memory=2**40)
    assert calls == {"validate": 0, "entries": 0}
    index = checkpoint.discover_checkpoint(entry.path, validate=False)
    assert [c.dtypes for c in entry.components] == [c.dtype_bytes() for c in index.components.values()]
    assert entry.bytes == sum(c.total_bytes for c in index.components.values())
    checkpoint.checkpoint_problems(entry.path, [tmp_path / "hub"])
    assert calls["validate"] == 1 and calls["entries"] > 0


def test_a_gguf_file_is_listed_with_its_quant_types_from_its_header_and_a_broken_one_says_why(tmp_path):
    from tests.loader.gguf_files import gguf_bytes

    folder = tmp_path / "models"
    folder.mkdir()
    tensors = [("blocks.0.attn.qkv_proj.weight", (96, 32), "Q8_0"), ("blocks.0.norm1.weight", (32,), "F32")]
    (folder / "dit-Q8_0.gguf").write_bytes(gguf_bytes(tensors))
    (folder / "cut-Q8_0.gguf").write_bytes(gguf_bytes(tensors)[:40])
    entries = {e.name: e for e in find_models([folder], memory=2**40)}
    assert [(e.layout, e.verdict) for e in entries.values()] == [("GGUF file", ""), ("GGUF file", "fits")]
    assert entries["cut-Q8_0.gguf"].problems[0].startswith("cut-Q8_0.gguf: truncated GGUF header")
    [component] = entries["dit-Q8_0.gguf"].components
    assert (component.name, component.dtypes) == ("transformer", {"Q8_0": 96 * 34, "F32": 128})
    assert component.run_bytes == 96 * 34 + 32 * 2  # kept packed; the plain F32 tensor at bf16
