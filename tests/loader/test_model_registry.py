"""The loader's model registry names no model package: builder plugins are found by listing a namespace."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch.nn as nn

from loader import model_registry

PLUGIN = '''
from loader.model_registry import register_model_builder
CALLS = []

def register_builders():
    CALLS.append(1)
    register_model_builder("{name}", lambda config: __import__("torch").nn.Linear(2, 2))
'''


@pytest.fixture
def namespace(tmp_path: Path, monkeypatch) -> Path:
    """A fresh namespace package `fake_plugins` (no `__init__.py`) on sys.path, and a registry to spoil."""
    folder = tmp_path / "fake_plugins"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(model_registry, "_BUILDERS", dict(model_registry._BUILDERS))
    monkeypatch.setattr(model_registry, "_loaded_plugins", set())
    yield folder
    for name in [m for m in sys.modules if m == "fake_plugins" or m.startswith("fake_plugins.")]:
        del sys.modules[name]


def test_every_module_of_the_namespace_registers_once(namespace: Path):
    (namespace / "b_second.py").write_text(PLUGIN.format(name="SecondModel"))
    (namespace / "a_first.py").write_text(PLUGIN.format(name="FirstModel"))
    assert model_registry.load_builder_plugins("fake_plugins") == ["fake_plugins.a_first", "fake_plugins.b_second"]
    assert model_registry.load_builder_plugins("fake_plugins") == ["fake_plugins.a_first", "fake_plugins.b_second"]
    assert sys.modules["fake_plugins.a_first"].CALLS == [1]  # the second call did not register again
    assert isinstance(model_registry.get_model_builder("FirstModel").build({}), nn.Linear)
    assert model_registry.get_model_builder("SecondModel") is not None


def test_an_absent_namespace_loads_nothing():
    assert model_registry.load_builder_plugins("no_such_plugin_namespace") == []


def test_a_plugin_without_register_builders_is_named(namespace: Path):
    (namespace / "broken.py").write_text("X = 1\n")
    with pytest.raises(ImportError, match=r"fake_plugins\.broken \(.*broken\.py\) defines no register_builders"):
        model_registry.load_builder_plugins("fake_plugins")


def test_the_loader_package_names_no_model_package():
    """Neither an import nor a module name in a string: `from models`, `import models`, `"models.x"`,
    `import_module("models")`. (A bare "models" is the `loader models` subcommand, the checkpoints it lists.)"""
    naming = re.compile(r"(?:from|import)\s+models\b|[\"']models\.|(?:import_module|__import__)\(\s*[\"']models[\"']")
    loader_dir = Path(model_registry.__file__).parent
    assert [str(p) for p in loader_dir.rglob("*.py") if naming.search(p.read_text())] == []
