"""LoRAs merged while the DiT streams: weights and frames equal diffusers' `load_lora_weights` + `fuse_lora` for every
layout, bad files refused in one line naming the file, the factors dropped as their weights are merged."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from models.checkpoint.components import load_component
from models.lora.inputs import LoraError, LoraInput, inspect_lora, parse_lora_arg
from models.lora.merge import merge_adjustments
from models.request.params import GenerateParams, GenerateParamsError
from models.run.pipeline import run_generate

from .lora_files import dit_linears, write_diffsynth_lora, write_musubi_lora, write_peft_lora
from .test_workflows import BASE, UNIFIED, _rgb, diffusers_digest, keyframe  # noqa: F401  (keyframe: a fixture)

SHORT = replace(BASE, steps=2)
"""One DiT call: enough for the merged weights to reach the frames, and the seed-contract runs stay short."""


def _diffusers_fused_dit(root: Path, files: list[tuple[Path, float]], partition: str = "transformer") -> dict:
    """The DiT state diffusers' own loading gives once each LoRA is loaded as its pipeline does and fused."""
    from diffusers import MiniMaxH3Transformer3DModel
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    dit = MiniMaxH3Transformer3DModel.from_pretrained(str(root / partition), torch_dtype=torch.bfloat16)
    for i, (file, _) in enumerate(files):
        state, metadata = MiniMaxH3LoraLoaderMixin.lora_state_dict(str(file), return_lora_metadata=True)
        prefix = next(iter(state)).split(".", 1)[0]
        dit.load_lora_adapter(state, prefix=prefix, metadata=metadata, adapter_name=f"a{i}")
    dit.set_adapters([f"a{i}" for i in range(len(files))], [s for _, s in files])
    dit.fuse_lora()
    return {k.replace(".base_layer", ""): v for k, v in dit.state_dict().items() if ".lora_" not in k}


def _merged_dit(root: Path, files: list[tuple[Path, float]], partition: str = "transformer"):
    config = json.loads((root / partition / "config.json").read_text())
    loras = [LoraInput(str(f), s, partition=partition) for f, s in files]
    adjust, merge = merge_adjustments(loras, partition, config, [root.parent])
    module, report = load_component(root, partition, dtype=torch.bfloat16, adjust=adjust, roots=[root.parent])
    return module.state_dict(), merge, adjust


def _assert_equal_states(ours: dict, theirs: dict) -> None:
    assert sorted(ours) == sorted(theirs)
    different = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    assert different == []


@pytest.fixture(scope="module")
def loras(h3_tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One file per layout, written next to the tiny checkpoint (under its model root)."""
    folder = h3_tiny.parent / "loras"
    folder.mkdir(exist_ok=True)
    return {
        "peft": write_peft_lora(folder / "style.safetensors", h3_tiny, rank=4, seed=1),
        "second": write_peft_lora(folder / "second.safetensors", h3_tiny, rank=2, seed=2,
                                  modules=["transformer_blocks.0.attn.to_q", "transformer_blocks.1.ff.net.2", "proj_in"]),
        "alpha": write_peft_lora(folder / "turbo.safetensors", h3_tiny, rank=4, seed=3,
                                 metadata={"alpha": "8", "num_inference_steps": "8"}),
        "musubi": write_musubi_lora(folder / "musubi.safetensors", h3_tiny, rank=4, seed=4, alpha=2.0),
        "ref": write_peft_lora(folder / "ref.safetensors", h3_tiny, rank=4, seed=5, prefix="transformer_ref"),
    }


@pytest.mark.parametrize("layout, scale", [("peft", 0.75), ("alpha", 1.0), ("musubi", 0.5)])
def test_the_streamed_merge_equals_diffusers_fuse_lora_bit_for_bit(h3_tiny: Path, loras, layout: str, scale: float):
    ours, merge, adjust = _merged_dit(h3_tiny, [(loras[layout], scale)])
    _assert_equal_states(ours, _diffusers_fused_dit(h3_tiny, [(loras[layout], scale)]))
    assert adjust == {} and merge.loras[0]["targets"] > 0 and merge.factor_bytes > 0


def test_two_stacked_loras_merge_in_order_as_diffusers_fuses_two_adapters(h3_tiny: Path, loras):
    files = [(loras["peft"], 0.5), (loras["second"], 1.0)]
    ours, merge, _ = _merged_dit(h3_tiny, files)
    _assert_equal_states(ours, _diffusers_fused_dit(h3_tiny, files))
    assert [m["targets"] for m in merge.loras] == [len(dit_linears(h3_tiny)), 3]


def test_the_merge_changes_exactly_the_targeted_weights(h3_tiny: Path, loras):
    base, _ = load_component(h3_tiny, "transformer", dtype=torch.bfloat16)
    ours, _, _ = _merged_dit(h3_tiny, [(loras["second"], 1.0)])
    changed = sorted(k for k, v in base.state_dict().items() if not torch.equal(v, ours[k]))
    assert changed == ["proj_in.weight", "transformer_blocks.0.attn.to_q.weight", "transformer_blocks.1.ff.net.2.weight"]


def test_an_alpha_in_the_metadata_scales_the_delta_and_its_steps_are_read(h3_tiny: Path, loras):
    facts = inspect_lora(LoraInput(str(loras["alpha"])), h3_tiny, "t2va", [h3_tiny.parent])
    assert facts.stated_steps == 8 and facts.ranks == (4,) and facts.lora.partition == "transformer"
    doubled, _, _ = _merged_dit(h3_tiny, [(loras["alpha"], 0.5)])  # alpha 8 / rank 4 = 2, times 0.5
    copy = loras["alpha"].with_name("no-alpha.safetensors")
    from safetensors import safe_open

    with safe_open(str(loras["alpha"]), "pt") as f:
        save_file({k: f.get_tensor(k) for k in f.keys()}, copy)
    single, _, _ = _merged_dit(h3_tiny, [(copy, 1.0)])
    assert all(torch.equal(doubled[k], single[k]) for k in single)  # the same factors, no metadata, at scale 1


def test_the_factors_are_held_only_until_their_weight_is_merged(h3_tiny: Path, loras):
    config = json.loads((h3_tiny / "transformer" / "config.json").read_text())
    adjust, merge = merge_adjustments([LoraInput(str(loras["peft"]), 1.0, partition="transformer")], "transformer",
                                      config, [h3_tiny.parent])
    held = []

    def on_tensor(placed):
        held.append(len(adjust))

    load_component(h3_tiny, "transformer", dtype=torch.bfloat16, adjust=adjust, on_tensor=on_tensor,
                   roots=[h3_tiny.parent])
    targets = merge.loras[0]["targets"]
    assert held == sorted(held, reverse=True) and held[-1] == 0 and max(held) < targets  # falls as weights merge


@pytest.mark.parametrize("layout", ["peft", "musubi"])
def test_the_factors_are_read_from_the_file_as_their_targets_come_up(h3_tiny: Path, loras, layout: str,
                                                                     monkeypatch):
    """No factor byte is read before the load; each group is read when its first weight is placed and dropped
    when its last is merged, so what is held at once is one group, not the file."""
    import os

    from loader.safetensors_file import read_shard_header
    from models.lora.inputs import converted_on_meta, factor_groups

    sent = []
    real_sendfile = os.sendfile
    monkeypatch.setattr(os, "sendfile", lambda out, src, offset, count: sent.append(count) or real_sendfile(
        out, src, offset, count))
    config = json.loads((h3_tiny / "transformer" / "config.json").read_text())
    adjust, merge = merge_adjustments([LoraInput(str(loras[layout]), 1.0, partition="transformer")], "transformer",
                                      config, [h3_tiny.parent])
    assert sent == []  # the hash read the file; no factor was kept from it
    read_by_tensor = []
    load_component(h3_tiny, "transformer", dtype=torch.bfloat16, adjust=adjust, roots=[h3_tiny.parent],
                   on_tensor=lambda placed: read_by_tensor.append(sum(sent)))
    shard, _ = read_shard_header(loras[layout])
    groups = factor_groups(shard.tensors)
    stored = sum(t.nbytes for t in shard.tensors)
    assert read_by_tensor[-1] == stored and read_by_tensor[0] < stored and len(groups) >= 2
    assert read_by_tensor == sorted(read_by_tensor) and len(set(read_by_tensor)) >= len(groups)  # group by group
    converted = converted_on_meta(shard, "x").values()
    largest = max(sum(v.numel() * v.element_size() for v in group.values()) for group in converted)
    assert 0 < merge.held_peak_bytes <= largest < merge.factor_bytes  # one group at a time (musubi: a QKV's three)


class _LiveBytes:
    """Counts the bytes of tensors created under it that are still alive, and their peak (a counting allocator in
    Python: each new storage is counted until its last tensor is collected)."""

    def __init__(self):
        self.live = self.peak = 0

    def __enter__(self):
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                inputs = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs))
                          if isinstance(t, torch.Tensor)}
                for t in torch.utils._pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                        nbytes = t.untyped_storage().nbytes()
                        counter.live += nbytes
                        counter.peak = max(counter.peak, counter.live)
                        weakref.finalize(t, counter.release, nbytes)
                return out

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def release(self, nbytes: int):
        self.live -= nbytes

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)


def test_the_merge_holds_one_block_of_temporaries_not_the_whole_weight_and_keeps_its_bits():
    from models.lora.inputs import MERGE_SLICES, merge_held_bytes
    from models.lora.merge import merge_delta

    g = torch.Generator().manual_seed(0)
    rows, cols, rank = 4 * MERGE_SLICES + 3, 512, 8  # ragged last block
    weight = torch.randn(rows, cols, generator=g).bfloat16()
    a, b = torch.randn(rank, cols, generator=g).bfloat16(), torch.randn(rows, rank, generator=g).bfloat16()
    whole = weight.clone()
    whole += (b.float() @ a.float()).mul_(0.75).to(torch.bfloat16)  # fuse_lora's arithmetic on the whole weight
    with _LiveBytes() as counter:
        merge_delta(weight, a, b, 0.75)
    assert torch.equal(weight, whole)
    assert counter.peak <= merge_held_bytes((rows, cols), rank)
    assert counter.peak < 0.5 * 6 * weight.numel()  # the whole-weight merge holds 6 bytes for each element


def test_a_file_changed_since_it_was_queued_is_refused_before_the_load(h3_tiny: Path, loras, tmp_path: Path):
    config = json.loads((h3_tiny / "transformer" / "config.json").read_text())
    with pytest.raises(LoraError, match="style.safetensors: its content changed since the job was queued"):
        merge_adjustments([LoraInput(str(loras["peft"]), 1.0, "0" * 64, "transformer")], "transformer", config,
                          [h3_tiny.parent])


# Refused at submit in one line, naming the file and what was found.

def _refusal(h3_tiny: Path, path: Path, workflow: str = "t2va", roots=None) -> str:
    with pytest.raises(LoraError) as err:
        inspect_lora(LoraInput(str(path)), h3_tiny, workflow, roots or [h3_tiny.parent])
    message = str(err.value)
    assert "\n" not in message and path.name in message
    return message


def test_a_lora_for_a_pruned_checkpoint_is_refused_naming_the_module_and_both_shapes(h3_tiny: Path):
    path = h3_tiny.parent / "loras" / "pruned.safetensors"
    save_file({"transformer.transformer_blocks.0.attn.to_q.lora_A.weight": torch.zeros(4, 16, dtype=torch.bfloat16),
               "transformer.transformer_blocks.0.attn.to_q.lora_B.weight": torch.zeros(32, 4, dtype=torch.bfloat16)}, path)
    message = _refusal(h3_tiny, path)
    assert "A [4, 16] and B [32, 4] but transformer's weight is [32, 32]" in message and "pruned" in message


def test_a_lora_that_targets_no_module_of_the_dit_is_refused(h3_tiny: Path):
    path = h3_tiny.parent / "loras" / "elsewhere.safetensors"
    save_file({"transformer.down_blocks.0.conv.lora_A.weight": torch.zeros(4, 16),
               "transformer.down_blocks.0.conv.lora_B.weight": torch.zeros(16, 4)}, path)
    assert "not Linear layers of transformer, e.g. 'down_blocks.0.conv'" in _refusal(h3_tiny, path)
    other = h3_tiny.parent / "loras" / "unprefixed.safetensors"
    save_file({"text_model.q.lora_A.weight": torch.zeros(4, 16), "text_model.q.lora_B.weight": torch.zeros(16, 4)}, other)
    assert "targets no module" in _refusal(h3_tiny, other)


def test_a_file_that_is_no_lora_or_no_safetensors_is_refused(h3_tiny: Path):
    shard = next((h3_tiny / "vae").glob("*.safetensors"))
    assert "holds no LoRA factors" in _refusal(h3_tiny, shard)
    pickle = h3_tiny.parent / "loras" / "old.ckpt"
    pickle.write_bytes(b"\x80\x04not read")
    assert "not a .safetensors file" in _refusal(h3_tiny, pickle)
    garbage = h3_tiny.parent / "loras" / "garbage.safetensors"
    garbage.write_bytes(b"\xff" * 64)
    assert "not a readable safetensors file" in _refusal(h3_tiny, garbage)


def test_a_lora_outside_the_model_roots_or_for_the_other_partition_is_refused(h3_tiny: Path, loras, tmp_path: Path):
    assert "outside the model roots" in _refusal(h3_tiny, loras["peft"], roots=[tmp_path])
    assert "targets transformer_ref, which only ref2va runs" in _refusal(h3_tiny, loras["ref"], "t2va")
    facts = inspect_lora(LoraInput(str(loras["peft"])), h3_tiny, "ref2va", [h3_tiny.parent])
    assert facts.lora.partition == "transformer_ref"  # diffusers routes transformer. layers there under ref2va


def test_lora_arguments_and_stored_entries():
    assert parse_lora_arg("a/b.safetensors") == LoraInput("a/b.safetensors", 1.0)
    assert parse_lora_arg("a/b.safetensors:0.8") == LoraInput("a/b.safetensors", 0.8)
    assert parse_lora_arg("c:/x.safetensors") == LoraInput("c:/x.safetensors", 1.0)
    with pytest.raises(ValueError, match="outside -10..10"):
        parse_lora_arg("a.safetensors:12")
    params = GenerateParams(prompt="p", loras=[{"file": "a.safetensors", "scale": 0.5, "sha256": "ab",
                                                "partition": "transformer"}, "b.safetensors:2"])
    assert params.loras == (LoraInput("a.safetensors", 0.5, "ab", "transformer"), LoraInput("b.safetensors", 2.0))
    assert GenerateParams(**params.to_dict()) == params  # a stored spec round-trips
    with pytest.raises(GenerateParamsError, match="loras: unknown LoRA field"):
        GenerateParams(prompt="p", loras=[{"file": "a.safetensors", "strength": 1}])


# The seed contract: frames equal diffusers' own pipeline with the LoRA loaded and fused.

def _fused(*files: tuple[Path, float], into_ref: bool = False):
    def prepare(pipe):
        for i, (file, _) in enumerate(files):
            pipe.load_lora_weights(str(file), adapter_name=f"a{i}")
        pipe.set_adapters([f"a{i}" for i in range(len(files))], [s for _, s in files])
        pipe.fuse_lora(components=["transformer_ref" if into_ref else "transformer"])

    return prepare


@pytest.mark.slow
def test_seed_contract_one_lora_and_two_stacked(h3_tiny: Path, loras, tmp_path: Path):
    one = run_generate(h3_tiny, replace(SHORT, loras=(LoraInput(str(loras["peft"]), 0.75),)), tmp_path / "a.mp4",
                       device_info=UNIFIED, roots=[h3_tiny.parent])
    assert one.video_sha256 == diffusers_digest(h3_tiny, "t2va", steps=2, prepare=_fused((loras["peft"], 0.75)))
    assert one.loras[0]["sha256"] and one.loads["transformer"]["lora"]["loras"][0]["scale"] == 0.75
    stacked = (LoraInput(str(loras["peft"]), 0.5), LoraInput(str(loras["second"]), 1.0))
    two = run_generate(h3_tiny, replace(SHORT, loras=stacked), tmp_path / "b.mp4", device_info=UNIFIED,
                       roots=[h3_tiny.parent])
    assert two.video_sha256 == diffusers_digest(h3_tiny, "t2va", steps=2,
                                                prepare=_fused((loras["peft"], 0.5), (loras["second"], 1.0)))
    assert two.video_sha256 != one.video_sha256


@pytest.mark.slow
def test_a_lora_is_prepared_in_its_own_sampled_stage_before_the_load_and_the_eta_has_its_work(
        h3_tiny: Path, loras, tmp_path: Path):
    from machine.offload import OffloadSettings
    from models.forecast.eta import stage_work
    from models.forecast import forecast_generate

    params = replace(SHORT, loras=(LoraInput(str(loras["peft"]), 1.0),))
    sampled = []
    result = run_generate(h3_tiny, params, tmp_path / "a.mp4", device_info=UNIFIED, roots=[h3_tiny.parent],
                          on_sample=lambda stage, sample: sampled.append(stage))
    stages = result.stages
    assert stages.index("lora.transformer") == stages.index("load.transformer") - 1
    assert "lora.transformer" in sampled and result.stage_seconds["lora.transformer"] > 0
    assert result.loads["transformer"]["lora"]["loras"][0]["targets"] > 0  # merged in the load that followed
    # the live chart's samples stay one per tensor placed, each merged weight sampled as it is placed
    assert sampled.count("load.transformer") > result.loads["transformer"]["tensors_placed"] > 0
    plain = run_generate(h3_tiny, SHORT, tmp_path / "b.mp4", device_info=UNIFIED, roots=[h3_tiny.parent])
    assert not any(s.startswith("lora.") for s in plain.stages)
    forecast = forecast_generate(h3_tiny, params, device_info=UNIFIED, settings=OffloadSettings())
    assert stage_work(forecast)["lora.transformer"] == forecast.lora_work["transformer"] > 0


def test_the_forecast_command_lists_the_lora_prep_among_the_loads(capsys, h3_tiny: Path, loras):
    from models.cli import main

    assert main(["forecast", str(h3_tiny), "--prompt", "x", "--lora", str(loras["peft"]), "--json"]) == 0
    stages = [entry["stage"] for entry in json.loads(capsys.readouterr().out)["loads"]]
    assert "lora.transformer" in stages and "load.transformer" in stages
    assert main(["forecast", str(h3_tiny), "--prompt", "x", "--lora", str(loras["ref"]), "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert "ref.safetensors: targets transformer_ref, which only ref2va runs" in error and "\n" not in error


def test_the_generate_command_merges_each_lora_given_and_refuses_a_bad_one_in_one_line(capsys, h3_tiny: Path, loras,
                                                                                       tmp_path: Path):
    from models.cli import main

    out = tmp_path / "clip.mp4"
    code = main(["generate", str(h3_tiny), "--prompt", "a red fox", "--out", str(out), "--width", "64", "--height", "64",
                 "--steps", "2", "--no-audio", "--lora", f"{loras['peft']}:0.75", "--lora", str(loras["second"]),
                 "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 0 and out.stat().st_size > 0
    assert [(Path(x["file"]).name, x["scale"], x["partition"]) for x in body["loras"]] == [
        ("style.safetensors", 0.75, "transformer"), ("second.safetensors", 1.0, "transformer")]
    assert all(len(x["sha256"]) == 64 for x in body["loras"])
    assert [m["targets"] for m in body["loads"]["transformer"]["lora"]["loras"]] == [len(dit_linears(h3_tiny)), 3]
    not_lora = next((h3_tiny / "vae").glob("*.safetensors"))
    code = main(["generate", str(h3_tiny), "--prompt", "a red fox", "--out", str(tmp_path / "bad.mp4"),
                 "--lora", str(not_lora), "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 2 and "\n" not in body["error"] and f"{not_lora.name}: holds no LoRA factors" in body["error"]
    assert not (tmp_path / "bad.mp4").exists()


def test_seed_contract_an_alpha_metadata_lora(h3_tiny: Path, loras, tmp_path: Path):
    result = run_generate(h3_tiny, replace(SHORT, loras=(LoraInput(str(loras["alpha"]), 1.0),)), tmp_path / "a.mp4",
                          device_info=UNIFIED, roots=[h3_tiny.parent])
    assert result.video_sha256 == diffusers_digest(h3_tiny, "t2va", steps=2, prepare=_fused((loras["alpha"], 1.0)))


@pytest.mark.slow
def test_seed_contract_a_transformer_ref_lora_under_ref2va(h3_tiny: Path, loras, keyframe: Path, tmp_path: Path):
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

    params = replace(SHORT, ref_image=str(keyframe), loras=(LoraInput(str(loras["ref"]), 0.75),))
    result = run_generate(h3_tiny, params, tmp_path / "r.mp4", device_info=UNIFIED, roots=[h3_tiny.parent])
    assert result.loras[0]["partition"] == "transformer_ref" and "lora" in result.loads["transformer_ref"]
    assert result.video_sha256 == diffusers_digest(
        h3_tiny, "ref2va", steps=2, prepare=_fused((loras["ref"], 0.75), into_ref=True),
        references=[MiniMaxH3ImageReference(image=_rgb(keyframe))])


@pytest.fixture(scope="module")
def h3_wide_heads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny profile with one 128-wide attention head: DiffSynth's per-head QKV de-interleave needs it."""
    from models.synth.writer import synth_h3
    from models.synth.profiles import get_profile

    tiny = get_profile("tiny")
    profile = dataclasses.replace(tiny, transformer={**tiny.transformer, "num_attention_heads": 1,
                                                     "attention_head_dim": 128, "hidden_size": 128})
    path = tmp_path_factory.mktemp("h3") / "wide"
    synth_h3(path, profile, seed=0, components=("transformer", "text_encoder", "vae", "audio_vae", "tokenizer",
                                                 "processor", "scheduler", "audio_scheduler"))
    return path


def test_a_diffsynth_lora_merges_as_diffusers_fuses_it(h3_wide_heads: Path):
    path = write_diffsynth_lora(h3_wide_heads.parent / "lineart.safetensors", h3_wide_heads, rank=4, seed=6)
    ours, merge, _ = _merged_dit(h3_wide_heads, [(path, 1.0)])
    _assert_equal_states(ours, _diffusers_fused_dit(h3_wide_heads, [(path, 1.0)]))
    assert merge.loras[0]["targets"] == 2 * 6  # per block: to_q, to_k, to_v, to_out.0, ff.net.0.proj, ff.net.2


@pytest.mark.slow
def test_seed_contract_a_diffsynth_layout_lora(h3_wide_heads: Path, tmp_path: Path):
    path = write_diffsynth_lora(h3_wide_heads.parent / "lineart2.safetensors", h3_wide_heads, rank=4, seed=7)
    result = run_generate(h3_wide_heads, replace(SHORT, loras=(LoraInput(str(path), 1.0),)), tmp_path / "d.mp4",
                          device_info=UNIFIED, roots=[h3_wide_heads.parent])
    assert result.video_sha256 == diffusers_digest(h3_wide_heads, "t2va", steps=2, prepare=_fused((path, 1.0)))


def test_the_forecast_counts_the_factors_held_while_the_dit_loads_and_nothing_after(h3_tiny: Path, loras):
    from machine.offload import OffloadSettings
    from models.forecast.eta import stage_work
    from models.forecast import forecast_generate
    from .test_forecast import CPU

    plain = forecast_generate(h3_tiny, BASE, device_info=CPU, settings=OffloadSettings())
    params = replace(BASE, loras=(LoraInput(str(loras["peft"]), 1.0),))
    merged = forecast_generate(h3_tiny, params, device_info=CPU, settings=OffloadSettings())
    facts = inspect_lora(params.loras[0], h3_tiny, "t2va", [h3_tiny.parent], hash_file=False)
    held = facts.held_bytes + facts.merge_bytes
    assert merged.lora_bytes == {"transformer": held}
    first = next(s for s in merged.stages if s.component == "transformer")
    assert first.lora_bytes == held and [s.lora_bytes for s in merged.stages if s is not first] == [0] * (
        len(merged.stages) - 1)
    before = plain.stage(first.stage)
    assert first.host_bytes - before.host_bytes == max(0, held - before.activation_bytes)
    assert merged.component_bytes == plain.component_bytes  # merged weights cost nothing resident
    assert merged.lora_work == {"transformer": facts.factor_bytes}
    assert stage_work(merged)["load.transformer"] == stage_work(plain)["load.transformer"] + facts.factor_bytes


def test_the_eta_learns_a_lora_load_per_lora_set_and_the_denoise_from_every_run():
    from models.forecast.eta import NO_HISTORY, StageRecord, estimate
    from models.lora.inputs import lora_key

    style = lora_key({"loras": [{"file": "/m/b.safetensors", "scale": 0.5, "sha256": "b" * 64},
                                {"file": "/m/a.safetensors", "sha256": "a" * 64}]})
    assert style == f"{'a' * 12}+{'b' * 12}"
    assert lora_key({"loras": ["/m/b.safetensors:2", {"file": "/m/a.safetensors", "sha256": "a" * 64}]}) == \
        f"{'a' * 12}+b.safetensors"  # no hash recorded yet: the file's name; the scale is no part of the key
    assert lora_key({}) == lora_key({"loras": []}) == ""
    device = "cpu:test"
    records = [StageRecord("load.transformer", 1.0, 100.0, device),
               StageRecord("denoise.denoise", 2.0, 10.0, device),
               StageRecord("load.transformer", 8.0, 100.0, device, loras=style),  # a CPU merge's arithmetic
               StageRecord("lora.transformer", 0.5, 10.0, device, loras=style),
               StageRecord("denoise.denoise", 2.0, 10.0, device, loras=style)]
    work = {"load.transformer": 100.0, "lora.transformer": 10.0, "denoise.denoise": 40.0}  # 4x the steps' work

    def seconds(loras: str) -> dict:
        return {e.stage: (e.seconds, e.basis) for e in estimate(work, records, device, loras=loras)}

    merged = seconds(style)
    assert merged["load.transformer"][0] == 8.0 and merged["lora.transformer"][0] == 0.5
    assert merged["denoise.denoise"] == (8.0, "median of 2 past runs")  # every run's denoise, scaled by its steps
    plain = seconds("")
    assert plain["load.transformer"][0] == 1.0 and plain["lora.transformer"] == (None, NO_HISTORY)
    assert seconds("c" * 12)["load.transformer"] == (None, NO_HISTORY)  # another LoRA set borrows no speed
