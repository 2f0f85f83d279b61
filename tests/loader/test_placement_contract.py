"""Contract every registered placement mode must meet: bit-identical results, mapping, merges, reports."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from core import PlacementError
from loader import LoadOptions, get_placement, known_placements, load_checkpoint
from loader.placement import Placement, register_placement

MODES = known_placements()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8)


def assert_bit_identical(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(_bits(actual), _bits(expected))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [None, "bf16", "fp16", "fp32"])
def test_every_mode_places_every_tensor_bit_for_bit(tiny_checkpoint, mode, dtype):
    module, report = load_checkpoint(tiny_checkpoint.path, LoadOptions(mode=mode, dtype=dtype))
    state = module.state_dict()
    assert sorted(state) == sorted(tiny_checkpoint.tensors)
    target = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    for name, source in tiny_checkpoint.tensors.items():
        expected = source.to(target) if target is not None and source.is_floating_point() else source
        assert_bit_identical(state[name], expected)
        assert state[name].device.type == "cpu"
    assert report.tensors_placed == report.tensors_total == len(tiny_checkpoint.tensors)
    assert report.bytes_placed == sum(t.nbytes for t in state.values())
    assert report.bytes_read == sum(t.nbytes for t in tiny_checkpoint.tensors.values())
    assert report.missing == report.unexpected == report.skipped == []


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_renames_merges_and_applies_dtype_overrides(tiny_checkpoint, mode):
    module, report = load_checkpoint(
        tiny_checkpoint.path,
        LoadOptions(mode=mode, dtype="fp16",
                    dtype_overrides={r"norm\.weight$": "fp32", r"^proj_in\.": torch.bfloat16},
                    rename={r"^blocks\.": "layers.", r"\.ff\.": ".mlp."},
                    merges={r"\1.qkv.weight": [r"(.+)\.to_q\.weight", r"(.+)\.to_k\.weight", r"(.+)\.to_v\.weight"]}),
    )
    t = tiny_checkpoint.tensors
    state = module.state_dict()
    assert sorted(state) == [
        "layers.0.attn.qkv.weight", "layers.0.norm.weight", "layers.1.mlp.weight",
        "proj_in.bias", "proj_in.weight", "steps",
    ]
    qkv = torch.cat([t[f"blocks.0.attn.to_{p}.weight"] for p in "qkv"]).half()
    assert_bit_identical(state["layers.0.attn.qkv.weight"], qkv)
    assert_bit_identical(state["layers.0.norm.weight"], t["blocks.0.norm.weight"])
    assert_bit_identical(state["layers.1.mlp.weight"], t["blocks.1.ff.weight"])
    assert_bit_identical(state["proj_in.weight"], t["proj_in.weight"].bfloat16())
    assert_bit_identical(state["steps"], t["steps"])
    assert report.tensors_placed == 6


class _Target(nn.Module):
    """A module whose names differ from the tiny checkpoint: one missing, some unexpected."""

    def __init__(self):
        super().__init__()
        self.proj_in = nn.Linear(4, 16)
        self.proj_out = nn.Linear(16, 4)


@pytest.mark.parametrize("mode", MODES)
def test_strict_load_counts_missing_and_unexpected_names_and_quotes_the_first(tiny_checkpoint, mode):
    with torch.device("meta"):
        module = _Target()
    with pytest.raises(PlacementError) as err:
        load_checkpoint(tiny_checkpoint.path, LoadOptions(mode=mode), module=module)
    message = str(err.value)
    assert "2 missing from" in message and "6 unexpected, e.g." in message and message.endswith(", ...")
    for name in ["proj_out.weight", "proj_out.bias", "blocks.0.attn.to_q.weight"]:
        assert name in message
    assert module.proj_in.weight.is_meta, "a strict failure must not place anything"


@pytest.mark.parametrize("mode", MODES)
def test_non_strict_load_reports_missing_and_unexpected_and_places_the_rest(tiny_checkpoint, mode):
    with torch.device("meta"):
        module = _Target()
    module, report = load_checkpoint(tiny_checkpoint.path, LoadOptions(mode=mode, strict=False), module=module)
    assert sorted(report.loaded) == ["proj_in.bias", "proj_in.weight"]
    assert report.missing == ["proj_out.bias", "proj_out.weight"]
    assert "blocks.1.ff.weight" in report.unexpected and len(report.unexpected) == 6
    assert_bit_identical(module.proj_in.weight.data, tiny_checkpoint.tensors["proj_in.weight"])
    assert module.proj_in.weight.requires_grad, "a placed parameter keeps the module's requires_grad"
    assert module.proj_out.weight.is_meta


@pytest.mark.parametrize("mode", MODES)
def test_shape_mismatch_names_tensor_file_and_both_shapes(tiny_checkpoint, mode):
    with torch.device("meta"):
        module = _Target()
        module.proj_in = nn.Linear(8, 16)
    with pytest.raises(PlacementError, match=r"'proj_in.weight' from model-00003-of-00003.safetensors has shape \(16, 4\); module expects \(16, 8\)"):
        load_checkpoint(tiny_checkpoint.path, LoadOptions(mode=mode, strict=False), module=module)


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_rejects_unknown_options_naming_the_mode(mode):
    with pytest.raises(PlacementError, match=f"placement mode '{mode}' does not take option.*bogus"):
        get_placement(mode, bogus=1)


def test_unknown_mode_lists_the_known_ones(tiny_checkpoint):
    with pytest.raises(PlacementError, match="unknown placement mode 'stram'; known: drain, retain, stream"):
        load_checkpoint(tiny_checkpoint.path, LoadOptions(mode="stram"))


def test_registering_a_mode_name_twice_is_refused():
    with pytest.raises(ValueError, match="'stream' is already registered"):

        @register_placement("stream")
        class Again(Placement):
            pass


@pytest.mark.parametrize("mode", MODES)
def test_cpu_load_in_checkpoint_dtype_survives_deleting_the_files(tiny_checkpoint, component_writer, mode):
    folder = component_writer(tiny_checkpoint.shards)
    module, _ = load_checkpoint(folder, LoadOptions(mode=mode))
    for file in folder.iterdir():
        file.unlink()
    for name, tensor in module.state_dict().items():
        assert_bit_identical(tensor, tiny_checkpoint.tensors[name])
        assert tensor.untyped_storage().nbytes() == tensor.nbytes, f"{name} is a view into a larger (mapped) storage"


@pytest.mark.parametrize("mode", MODES)
def test_on_tensor_sees_every_placement_in_order_with_a_sample(tiny_checkpoint, mode):
    events = []
    _, report = load_checkpoint(tiny_checkpoint.path, LoadOptions(mode=mode), on_tensor=events.append)
    assert [e.index for e in events] == list(range(1, len(tiny_checkpoint.tensors) + 1))
    assert {e.total for e in events} == {len(tiny_checkpoint.tensors)}
    assert [e.name for e in events] == report.loaded
    assert events[-1].bytes_placed == report.bytes_placed == sum(e.nbytes for e in events)
    assert all(e.sample.vm_rss > 0 for e in events)
    assert report.samples == len(events) + 2, "baseline + one per tensor + the final one"



@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [None, "fp32"])
def test_every_mode_applies_an_adjustment_before_the_tensor_is_installed_and_reported(tiny_checkpoint, mode, dtype):
    order = []

    def change(name, how):
        def apply(t):
            order.append(("adjust", name))
            how(t)
        return apply

    adjust = {"proj_in.weight": change("proj_in.weight", lambda t: t.mul_(2)),
              "blocks.0.attn.to_v.weight": change("blocks.0.attn.to_v.weight", lambda t: t.add_(1))}
    module, report = load_checkpoint(
        tiny_checkpoint.path,
        LoadOptions(mode=mode, dtype=dtype, adjust=adjust),
        on_tensor=lambda p: order.append(("placed", p.name)),
    )
    state, t = module.state_dict(), tiny_checkpoint.tensors

    def source(name):
        return t[name].float() if dtype else t[name]

    assert_bit_identical(state["proj_in.weight"], source("proj_in.weight") * 2)
    assert_bit_identical(state["blocks.0.attn.to_v.weight"], source("blocks.0.attn.to_v.weight") + 1)
    assert_bit_identical(state["blocks.0.attn.to_q.weight"], source("blocks.0.attn.to_q.weight"))
    for name in ("proj_in.weight", "blocks.0.attn.to_v.weight"):
        assert order.index(("adjust", name)) == order.index(("placed", name)) - 1
    assert adjust == {}  # consumed: what each change held is freed as the load goes
    assert report.tensors_placed == len(t)


def test_an_adjustment_for_a_tensor_the_load_never_places_is_refused_before_any_read(tiny_checkpoint):
    read = []
    with pytest.raises(PlacementError, match="not placed by this load, e.g. blocks.9.weight"):
        load_checkpoint(
            tiny_checkpoint.path,
            LoadOptions(adjust={"blocks.9.weight": lambda t: None}),
            on_tensor=lambda p: read.append(p.name),
        )
    assert read == []
