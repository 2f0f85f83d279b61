"""Known model classes: `config.json`'s `_class_name` -> a builder of the module skeleton.

The loader names no model package. Model packages register their classes here
(`register_model_builder`); whoever knows both registers them: a job kind, or a
plugin (`core.plugins`: the repository's `drainboard_plugins/minimax_h3.py`),
which hands in a deferred registration (`register_builder_source`) that
`python -m loader` runs before a load (`load_model_builders`). A checkpoint
whose class is not registered gets a skeleton built from its own metadata
instead (see the skeleton module). Torch-free at import: plugins import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from core.plugins import load_plugins

if TYPE_CHECKING:
    import torch.nn as nn


@dataclass(frozen=True)
class ModelBuilder:
    """How to build one model class for loading."""

    class_name: str
    """The `_class_name` in the component's `config.json`."""
    build: Callable[[dict], "nn.Module"]
    """Builds the module from the parsed `config.json`; called under `torch.device("meta")`."""
    keep_fp32: tuple[str, ...] = field(default=())
    """Regexes of parameter names that stay float32 whatever the requested dtype (norms, embeddings)."""


_BUILDERS: dict[str, ModelBuilder] = {}


def register_model_builder(
    class_name: str, build: Callable[[dict], "nn.Module"], *, keep_fp32: tuple[str, ...] = ()
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


_SOURCES: dict[str, Callable[[], None]] = {}
"""Plugins' deferred registrations, by name, not run yet."""


def register_builder_source(name: str, register: Callable[[], None]) -> None:
    """A plugin's model classes, registered when a command asks for them (`load_model_builders`): `register()`
    imports the model package and calls `register_model_builder`, so importing the plugin stays cheap."""
    _SOURCES.setdefault(name, register)


def load_model_builders() -> list[str]:
    """Load the plugins (`core.plugins`) and run every builder source not run yet (what `python -m loader` does
    before a load, so it builds their classes); the sources run, by name."""
    load_plugins()
    ran = []
    while _SOURCES:
        name, register = _SOURCES.popitem()
        register()
        ran.append(name)
    return sorted(ran)
