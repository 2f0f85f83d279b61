"""Known model classes: `config.json`'s `_class_name` -> a builder of the module skeleton.

`models/` registers its classes here; the loader never imports `models/`.
A checkpoint whose class is not registered gets a skeleton built from its own
metadata instead (see the skeleton module).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch.nn as nn


@dataclass(frozen=True)
class ModelBuilder:
    """How to build one model class for loading."""

    class_name: str
    """The `_class_name` in the component's `config.json`."""
    build: Callable[[dict], nn.Module]
    """Builds the module from the parsed `config.json`; called under `torch.device("meta")`."""
    keep_fp32: tuple[str, ...] = field(default=())
    """Regexes of parameter names that stay float32 whatever the requested dtype (norms, embeddings)."""


_BUILDERS: dict[str, ModelBuilder] = {}


def register_model_builder(
    class_name: str, build: Callable[[dict], nn.Module], *, keep_fp32: tuple[str, ...] = ()
) -> None:
    """Register a builder; registering the same class name twice is an error."""
    if class_name in _BUILDERS:
        raise ValueError(f"model class {class_name!r} is already registered; pick another `_class_name`")
    _BUILDERS[class_name] = ModelBuilder(class_name, build, tuple(keep_fp32))


def get_model_builder(class_name: str | None) -> ModelBuilder | None:
    """The registered builder for `class_name`, or None when the class is unknown."""
    if class_name is None:
        return None
    return _BUILDERS.get(class_name)
