"""The one way Drainboard finds plugins: modules that register what they add when they are imported.

A plugin is a module calling the registries' own functions at import
(`loader.register_placement`, `core.dtype_names.register_dtype`,
`jobs.kinds.job_kind`, `loader.model_registry.register_builder_source`; see
docs/extending.md). `load_plugins()` imports, once per process, every module of
the `drainboard_plugins` namespace package (a folder with no `__init__.py`: the
repository's own, and any that an installed distribution or a folder on
PYTHONPATH adds), then the modules `DRAINBOARD_PLUGINS` names (comma-separated:
a project's or a test's, with no install step; a job child inherits it). Every
registry loads them before it answers, so a plugin's mode, dtype, kind or model
class is everywhere its built-in peers are. Plugins import heavy libraries
(torch) inside functions: listing jobs imports every plugin and stays torch-free.
Built-ins register with the same functions, imported by their own packages.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil

from .echo import echo
from .errors import DrainboardError

NAMESPACE = "drainboard_plugins"
"""The namespace package whose every module is a plugin."""
PLUGINS_ENV = "DRAINBOARD_PLUGINS"
"""The setting naming more plugin modules, comma-separated."""

_loaded: list[str] = []
"""The plugin modules imported so far, in order."""


class PluginError(DrainboardError):
    """A plugin module named in DRAINBOARD_PLUGINS cannot be imported (one line, exit 2 in a CLI)."""


def plugin_modules(env: dict[str, str] | None = None) -> list[str]:
    """The plugin modules: the namespace's, sorted, then those the setting names, in its order."""
    found = []
    if importlib.util.find_spec(NAMESPACE) is not None:
        package = importlib.import_module(NAMESPACE)
        found = sorted(info.name for info in pkgutil.iter_modules(package.__path__, f"{NAMESPACE}."))
    named = (os.environ if env is None else env).get(PLUGINS_ENV, "")
    return list(dict.fromkeys(found + [m.strip() for m in named.split(",") if m.strip()]))


def load_plugins() -> list[str]:
    """Import every plugin module not imported yet; the modules imported so far, in order. A module the setting
    names that cannot be found is a `PluginError` naming it."""
    for name in plugin_modules():
        if name in _loaded:
            continue
        _loaded.append(name)  # before the import: a plugin that asks a registry while it loads is not re-entered
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            _loaded.remove(name)
            if e.name is not None and (name == e.name or name.startswith(f"{e.name}.")):
                raise PluginError(f"{PLUGINS_ENV} names {echo(name)}, which cannot be imported: "
                                  f"no module named {echo(e.name)}") from None
            raise
        except BaseException:
            _loaded.remove(name)
            raise
    return list(_loaded)
