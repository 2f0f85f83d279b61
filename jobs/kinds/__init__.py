"""Registry of job kinds: `@job_kind("load")` on a function `run(spec, ctx) -> metrics dict`.

Built-in kinds live in this package and register exactly like plugins do.
Modules named in `DRAINBOARD_KIND_MODULES` (comma-separated) are imported
too, so a project, or a test, can add kinds that the job child also finds.
Kind modules import heavy libraries (torch) inside `run`, so listing the
kinds stays cheap for the CLI and the dashboard.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable

from core.echo import echo
from storage.config import ConfigError

KindFunction = Callable[..., dict[str, Any]]

_KINDS: dict[str, KindFunction] = {}
_BUILTIN_MODULES = ("jobs.kinds.generate", "jobs.kinds.load")


def job_kind(name: str) -> Callable[[KindFunction], KindFunction]:
    """Register `run(spec, ctx) -> dict` as the job kind `name`; registering a name twice is an error."""

    def register(run: KindFunction) -> KindFunction:
        if name in _KINDS and _KINDS[name] is not run:
            raise ValueError(f"job kind {name!r} is already registered by {_KINDS[name].__module__}")
        _KINDS[name] = run
        return run

    return register


def load_kinds() -> None:
    """Import the built-in kinds and those named in DRAINBOARD_KIND_MODULES.

    A module of that setting that cannot be found is a `ConfigError` naming it (one line, exit 2 in a CLI).
    """
    extra = [m.strip() for m in os.environ.get("DRAINBOARD_KIND_MODULES", "").split(",") if m.strip()]
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)
    for module in extra:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            raise ConfigError(f"DRAINBOARD_KIND_MODULES names {echo(module)}, which cannot be imported: "
                              f"no module named {echo(e.name)}") from None


def kind_names() -> tuple[str, ...]:
    load_kinds()
    return tuple(sorted(_KINDS))


def get_kind(name: str) -> KindFunction:
    """The function of kind `name`; an unknown name lists the known ones."""
    load_kinds()
    if name not in _KINDS:
        raise KeyError(f"unknown job kind {name!r}; known: {', '.join(sorted(_KINDS))}")
    return _KINDS[name]
