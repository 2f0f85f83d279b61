"""Known model classes: `config.json`'s `_class_name` -> a builder of the module skeleton.

The loader names no model package. Model packages register their classes here
(`register_model_builder`); whoever knows both registers them: a job kind, or,
for `python -m loader`, a plugin module in the `loader_plugins` namespace
package (`load_builder_plugins`), found by listing the namespace, as the Python
packaging guide's namespace-package plugins are, with no install step. A
checkpoint whose class is not registered gets a skeleton built from its own
metadata instead (see the skeleton module).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
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


PLUGIN_NAMESPACE = "loader_plugins"
"""The namespace package (no `__init__.py`) whose every module defines `register_builders()`; the loader's
command line calls each. The repo's own, `loader_plugins/minimax_h3.py`, registers MiniMax H3's classes."""

_loaded_plugins: set[str] = set()


def load_builder_plugins(namespace: str = PLUGIN_NAMESPACE) -> list[str]:
    """Import every module of the namespace package `namespace` and call its `register_builders()` (once per
    module); the module names, sorted. An absent namespace loads nothing."""
    if importlib.util.find_spec(namespace) is None:
        return []
    package = importlib.import_module(namespace)
    loaded = []
    for info in sorted(pkgutil.iter_modules(package.__path__, f"{namespace}."), key=lambda m: m.name):
        if info.name not in _loaded_plugins:
            plugin = importlib.import_module(info.name)
            register = getattr(plugin, "register_builders", None)
            if not callable(register):
                raise ImportError(
                    f"builder plugin {info.name} ({plugin.__file__}) defines no register_builders();"
                    f" every module of the {namespace} namespace must"
                )
            register()
            _loaded_plugins.add(info.name)
        loaded.append(info.name)
    return loaded
