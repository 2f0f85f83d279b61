"""Known model classes: `config.json`'s `_class_name` -> a builder of the module skeleton.

`models/` registers its classes here; the loader never imports `models/` as a
dependency. Its command line loads the builder plugins that are present
(`load_builder_plugins`): modules with a `register_builders()` function, found
with `importlib.util.find_spec` and imported only then. A checkpoint whose class
is not registered gets a skeleton built from its own metadata instead (see the
skeleton module).
"""

from __future__ import annotations

import importlib
import importlib.util
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


DEFAULT_BUILDER_MODULES: tuple[str, ...] = ("models.components",)
"""Plugins the loader's command line loads when present: MiniMax H3's diffusers / transformers classes."""

_loaded_plugins: set[str] = set()


def load_builder_plugins(modules: tuple[str, ...] = DEFAULT_BUILDER_MODULES) -> list[str]:
    """Import each present module of `modules` (once) and call its `register_builders()`; the names loaded."""
    loaded = []
    for name in modules:
        if name not in _loaded_plugins:
            try:
                present = importlib.util.find_spec(name) is not None
            except ModuleNotFoundError:
                present = False
            if not present:
                continue
            importlib.import_module(name).register_builders()
            _loaded_plugins.add(name)
        loaded.append(name)
    return loaded
