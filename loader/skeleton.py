"""A module skeleton built from checkpoint metadata, for checkpoints with no registered model class.

Its parameters carry the checkpoint's (mapped) names, shapes and dtypes and
live on the meta device, so any safetensors checkpoint can be loaded and
measured without model code.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn as nn

from core.echo import NAME_LIMIT, echo
from core.errors import PlacementError, first_of

_MODULE_ATTRIBUTES = frozenset(dir(nn.Module()))
"""Names every plain module already has (`forward`, `training`, ...): no child or tensor may take one.

`add_module` and `register_parameter` refuse these by probing the module with
`hasattr`, which for a new name raises and catches an AttributeError inside
torch: that probe was most of the cost of building the 639-tensor H3 DiT's
skeleton, so the skeleton checks names against this set and fills the
module's dicts itself (torch's global registration hooks, which nothing here
installs, do not see its placeholders)."""


def build_skeleton(tensors: Iterable[tuple[str, tuple[int, ...], torch.dtype]]) -> nn.Module:
    """A tree of plain `nn.Module`s with one meta parameter per (name, shape, dtype)."""
    root = nn.Module()
    problems = []
    for name, shape, dtype in tensors:
        *path, leaf = name.split(".")
        owner = root
        try:
            for part in path:
                child = owner._modules.get(part)
                if child is None:
                    if part in owner._parameters:
                        raise PlacementError(f"{echo(name, NAME_LIMIT)} nests under tensor {echo(part, NAME_LIMIT)}")
                    child = owner._modules[_free_name(part, name)] = nn.Module()
                owner = child
            if leaf in owner._modules:
                raise PlacementError(f"{echo(name, NAME_LIMIT)} is both a tensor and a module prefix")
            if leaf in owner._parameters:
                raise PlacementError(f"{echo(name, NAME_LIMIT)} appears twice")
            param = nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"), requires_grad=False)
            owner._parameters[_free_name(leaf, name)] = param
        except PlacementError as exc:
            problems.append(f"cannot build a skeleton tensor {echo(name, NAME_LIMIT)}: {exc}")
    if problems:
        raise PlacementError("; ".join(first_of(problems)))
    return root


def _free_name(part: str, name: str) -> str:
    """`part` of tensor `name`, refused where a module could not hold it under that name."""
    if not part:
        raise PlacementError(f"{echo(name, NAME_LIMIT)} has an empty name part")
    if part in _MODULE_ATTRIBUTES:
        raise PlacementError(f"{echo(part, NAME_LIMIT)} in {echo(name, NAME_LIMIT)} is an attribute every module has")
    return part
