"""A module skeleton built from checkpoint metadata, for checkpoints with no registered model class.

Its parameters carry the checkpoint's (mapped) names, shapes and dtypes and
live on the meta device, so any safetensors checkpoint can be loaded and
measured without model code.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn as nn

from .errors import PlacementError


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
                        raise PlacementError(f"{name!r} nests under tensor {part!r}")
                    child = nn.Module()
                    owner.add_module(part, child)
                owner = child
            if leaf in owner._modules:
                raise PlacementError(f"{name!r} is both a tensor and a module prefix")
            owner.register_parameter(
                leaf, nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"), requires_grad=False)
            )
        except (PlacementError, KeyError) as exc:
            problems.append(f"cannot build a skeleton tensor {name!r}: {exc}")
    if problems:
        raise PlacementError("; ".join(problems))
    return root
