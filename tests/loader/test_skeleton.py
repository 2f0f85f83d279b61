import pytest
import torch
import torch.nn as nn

from core.errors import PlacementError
from loader.skeleton import build_skeleton


def test_the_skeleton_holds_every_tensor_on_meta_under_its_dotted_name():
    specs = [("blocks.0.attn.weight", (8, 4), torch.bfloat16), ("blocks.0.attn.bias", (8,), torch.float32),
             ("blocks.1.norm.weight", (4,), torch.float16), ("proj_out.weight", (2, 4), torch.bfloat16)]
    module = build_skeleton(specs)
    state = module.state_dict(keep_vars=True)
    assert list(state) == [name for name, _, _ in specs]
    for name, shape, dtype in specs:
        tensor = module.get_parameter(name)
        assert tensor is state[name] and tensor.is_meta and not tensor.requires_grad
        assert (tuple(tensor.shape), tensor.dtype) == (shape, dtype)
    assert isinstance(getattr(module.blocks, "1"), nn.Module) and isinstance(module.get_submodule("blocks.0.attn"), nn.Module)
    assert [n for n, _ in module.named_modules()] == ["", "blocks", "blocks.0", "blocks.0.attn", "blocks.1",
                                                      "blocks.1.norm", "proj_out"]


@pytest.mark.parametrize("names, problem", [
    (["a.weight", "a.weight.scale"], "'a.weight.scale' nests under tensor 'weight'"),
    (["a.b.weight", "a.b"], "'a.b' is both a tensor and a module prefix"),
    (["a.weight", "a.weight"], "'a.weight' appears twice"),
    (["a..weight"], "'a..weight' has an empty name part"),
    (["blocks.forward.weight"], "'forward' in 'blocks.forward.weight' is an attribute every module has"),
    (["norm.training"], "'training' in 'norm.training' is an attribute every module has"),
])
def test_names_a_module_cannot_hold_are_refused_each_by_name(names, problem):
    with pytest.raises(PlacementError) as exc:
        build_skeleton((name, (2,), torch.float32) for name in names + ["ok.weight"])
    assert problem in str(exc.value)
    assert "ok.weight" not in str(exc.value)


def test_every_refused_name_is_listed_in_one_error():
    with pytest.raises(PlacementError) as exc:
        build_skeleton((name, (2,), torch.float32) for name in ["x.forward", "y..z", "fine.weight"])
    message = str(exc.value)
    assert "'x.forward'" in message and "'y..z'" in message and "fine.weight" not in message
