"""One way to find plugins: every module of the `drainboard_plugins` namespace, then those DRAINBOARD_PLUGINS
names, each imported once; a name that cannot be imported is one line naming it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from core import plugins

PLUGIN = "import sys\nsys.modules['{name}'].__dict__.setdefault('IMPORTS', 0)\nIMPORTS += 1\n"


@pytest.fixture
def folder(tmp_path: Path, monkeypatch) -> Path:
    """A folder on sys.path holding a `drainboard_plugins` part of its own (namespaces merge across sys.path), and
    a process that has loaded no plugin yet."""
    (tmp_path / "drainboard_plugins").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_loaded", [])
    monkeypatch.delenv(plugins.PLUGINS_ENV, raising=False)
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith(("drainboard_plugins.zz_", "my_plugin"))]:
        del sys.modules[name]


def test_the_namespaces_modules_then_the_settings_are_imported_once_each(folder: Path, monkeypatch):
    (folder / "drainboard_plugins" / "zz_fake.py").write_text(PLUGIN.format(name="drainboard_plugins.zz_fake"))
    (folder / "my_plugin.py").write_text(PLUGIN.format(name="my_plugin"))
    monkeypatch.setenv(plugins.PLUGINS_ENV, " my_plugin , ")
    loaded = plugins.load_plugins()
    assert loaded == ["drainboard_plugins.minimax_h3", "drainboard_plugins.zz_fake", "my_plugin"]
    assert plugins.load_plugins() == loaded
    assert sys.modules["drainboard_plugins.zz_fake"].IMPORTS == sys.modules["my_plugin"].IMPORTS == 1


def test_a_setting_naming_a_missing_module_is_one_line_naming_it(folder: Path, monkeypatch):
    monkeypatch.setenv(plugins.PLUGINS_ENV, "no_such_plugin")
    with pytest.raises(plugins.PluginError, match=r"^DRAINBOARD_PLUGINS names 'no_such_plugin', which cannot be "
                                                  r"imported: no module named 'no_such_plugin'$"):
        plugins.load_plugins()
    assert "no_such_plugin" not in plugins._loaded  # a fixed setting is tried again


def test_a_plugin_missing_a_module_of_its_own_raises_that_not_a_bad_setting(folder: Path, monkeypatch):
    (folder / "my_plugin.py").write_text("import no_such_dependency\n")
    monkeypatch.setenv(plugins.PLUGINS_ENV, "my_plugin")
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency"):
        plugins.load_plugins()
