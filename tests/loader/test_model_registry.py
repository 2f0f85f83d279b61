"""The loader's model registry names no model package: a plugin hands in its classes as a deferred source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch.nn as nn

from loader import model_registry


@pytest.fixture
def registry(monkeypatch):
    """A registry to spoil: no builders, no sources, no plugin of the repository's adding its own."""
    monkeypatch.setattr(model_registry, "_BUILDERS", {})
    monkeypatch.setattr(model_registry, "_SOURCES", {})
    monkeypatch.setattr(model_registry, "load_plugins", lambda: [])


def test_a_builder_source_registers_its_classes_once_when_a_command_asks(registry):
    calls = []

    def register():
        calls.append(1)
        model_registry.register_model_builder("FirstModel", lambda config: nn.Linear(2, 2))

    model_registry.register_builder_source("first", register)
    model_registry.register_builder_source("first", lambda: calls.append("again"))  # a name keeps its first source
    assert model_registry.get_model_builder("FirstModel") is None  # not before it is asked for
    assert model_registry.load_model_builders() == ["first"]
    assert model_registry.load_model_builders() == []
    assert calls == [1] and isinstance(model_registry.get_model_builder("FirstModel").build({}), nn.Linear)


def test_the_loader_package_names_no_model_package():
    """Neither an import nor a module name in a string: `from models`, `import models`, `"models.x"`,
    `import_module("models")`. (A bare "models" is the `loader models` subcommand, the checkpoints it lists.)"""
    naming = re.compile(r"(?:from|import)\s+models\b|[\"']models\.|(?:import_module|__import__)\(\s*[\"']models[\"']")
    loader_dir = Path(model_registry.__file__).parent
    assert [str(p) for p in loader_dir.rglob("*.py") if naming.search(p.read_text())] == []
