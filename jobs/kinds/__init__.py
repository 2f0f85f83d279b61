"""Registry of job kinds: a `JobKind` subclass (or a plain `run(spec, ctx)` function) under `@job_kind("name")`.

A kind is whole in its own module: its options (a dataclass, stored in the spec
beside the fields every job has), their check at submit, its `jobs submit` flags,
the fields the Run page draws for it, its forecast for the submit check, and `run`.
Built-in kinds live in this package and register exactly like plugins do; a
plugin's kinds are found as every plugin is (`core.plugins`: the
`drainboard_plugins` namespace and `DRAINBOARD_PLUGINS`, which a job child
inherits; docs/extending.md). Kind modules import heavy libraries (torch) inside
their methods, so listing the kinds stays cheap for the CLI and the dashboard.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from core.echo import echo
from core.plugins import load_plugins
from jobs.errors import Problems
from storage.config import Config

if TYPE_CHECKING:
    import sqlite_utils

    from jobs.context import JobContext
    from machine.device import DeviceInfo

JobSpec = Any
"""A `jobs.spec.JobSpec` (which imports this registry, so it is not imported here: no circle)."""
KindForecast = Any
"""A `jobs.admission.KindForecast` (same reason)."""

KindFunction = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class NoOptions:
    """The options of a kind that has none of its own."""


@dataclass(frozen=True)
class FormField:
    """One of a kind's options as the Run page draws it, for a kind the page has no section of its own for: a
    selectbox of `choices`, else a widget for its default's type (a checkbox, a whole number, a line of text)."""

    name: str
    """The options field it sets."""
    label: str
    """The widget's label."""
    help: str = ""
    """The widget's tooltip."""
    choices: tuple = ()
    """The values offered, when it is a choice."""


class JobKind:
    """A job kind: a name, its options and everything that reads them. Subclass it, set the class attributes,
    override what applies; every method has a default that fits a kind without options or forecast."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    """What a job of the kind does, one clause: `jobs submit`'s help and the Run page's caption."""
    label: ClassVar[str] = ""
    """How the Run page's job control names it ("load + generate"); its name when empty."""
    example: ClassVar[str] = ""
    """A `python -m jobs submit ...` line for its help."""
    options: ClassVar[type] = NoOptions
    """The dataclass of its own spec fields; stored flat in the spec beside the common ones."""
    reads_checkpoint: ClassVar[bool] = False
    """Whether the loader reads its `model`: refused at submit when the loader would refuse it."""
    form_fields: ClassVar[tuple[FormField, ...]] = ()
    """The options the Run page draws for it (built-in kinds have sections of their own)."""

    @staticmethod
    def run(spec: JobSpec, ctx: JobContext) -> dict[str, Any]:
        """Run the job, reporting only through `ctx`; returns its metrics."""
        raise NotImplementedError

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls.options))

    @classmethod
    def check(cls, raw: Mapping[str, Any], spec: Mapping[str, Any], config: Config, problems: Problems) -> Any:
        """Its options from `raw` (its own fields, as typed), each bad one filed in `problems`; `spec` holds the
        common fields, checked (None where bad). By default a field must have its default's type (a whole number
        may come as text); None where the default is None."""
        values = {}
        for f in fields(cls.options):
            if f.name not in raw:
                continue
            value, default = raw[f.name], f.default if f.default is not MISSING else None
            if default is not None and value is not None and type(value) is not type(default):
                try:
                    if isinstance(default, bool) or not isinstance(default, int):
                        raise ValueError
                    value = int(str(value))
                except ValueError:
                    problems.add(f.name, f"must be {type(default).__name__}, got {echo(value)}")
                    continue
            values[f.name] = value
        return cls.options(**values)

    @classmethod
    def read(cls, stored: Mapping[str, Any]) -> Any:
        """The options of a stored spec: its own fields, defaults for those it lacks, and other kinds' ignored (a
        spec stored before kinds had options of their own carried every kind's fields, mostly unset)."""
        names = set(cls.option_names())
        return cls.options(**{k: v for k, v in stored.items() if k in names})

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Its own `jobs submit NAME` flags (the common ones are there already)."""

    @classmethod
    def arguments(cls, args: argparse.Namespace) -> dict[str, Any]:
        """Its own raw spec fields from the parsed flags."""
        return {}

    @classmethod
    def prepare(cls, spec: JobSpec, config: Config, db: sqlite_utils.Database | None, **kwargs) -> JobSpec:
        """The spec as it will run, before the submit check assesses it (a generate's plan picks its levers); may
        raise `jobs.admission.JobRefused`."""
        return spec

    @classmethod
    def forecast(cls, spec: JobSpec, device: DeviceInfo, db: sqlite_utils.Database | None) -> KindForecast | None:
        """What the submit check weighs against the memory walls; None for no forecast (queued unchecked)."""
        return None

    @classmethod
    def resolve_offload(cls, spec: JobSpec, device: DeviceInfo):
        """The offload settings and decisions the job's probe stage makes (and the Run page previews)."""
        from machine.offload import resolve_offload

        return resolve_offload(spec.offload, device)

    @classmethod
    def ranks(cls, spec: JobSpec) -> int:
        """The processes that run the job's work beside its child (a parallel generate's ranks); 1 for one."""
        return 1

    @classmethod
    def ranks_per_host(cls, spec: JobSpec) -> int:
        """Of `ranks`, those one host holds (all of them unless they are spread over machines)."""
        return cls.ranks(spec)

    @classmethod
    def input_files(cls, spec: JobSpec) -> dict[str, str]:
        """Files the job reads that are copied into its folder when it is queued (field -> path)."""
        return {}


_KINDS: dict[str, type[JobKind]] = {}
_BUILTIN_MODULES = ("jobs.kinds.generate", "jobs.kinds.load")


def job_kind(name: str) -> Callable:
    """Register a `JobKind` subclass, or a function `run(spec, ctx) -> dict` (a kind without options), as the job
    kind `name`; registering another under a taken name is an error, the same one again is harmless."""

    def register(item):
        kind = item if isinstance(item, type) and issubclass(item, JobKind) else None
        existing = _KINDS.get(name)
        if existing is not None:
            if existing is item or existing.run is item:
                return item
            raise ValueError(f"job kind {name!r} is already registered by {existing.__module__}")
        if kind is None:
            kind = type(f"{name}_kind", (JobKind,), {
                "run": staticmethod(item), "__module__": item.__module__, "__doc__": item.__doc__,
                "summary": (item.__doc__ or "").strip().split("\n")[0].rstrip("."),
            })
        kind.name = name
        _KINDS[name] = kind
        return item

    return register


def load_kinds() -> None:
    """Import the built-in kinds and the plugins (`core.plugins.load_plugins`: a module DRAINBOARD_PLUGINS names
    that cannot be found is a `PluginError` naming it, one line, exit 2 in a CLI)."""
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)
    load_plugins()


def kind_names() -> tuple[str, ...]:
    load_kinds()
    return tuple(sorted(_KINDS))


def get_kind(name: str) -> type[JobKind]:
    """The kind `name`; an unknown name lists the known ones."""
    load_kinds()
    if name not in _KINDS:
        raise KeyError(f"unknown job kind {name!r}; known: {', '.join(sorted(_KINDS))}")
    return _KINDS[name]


def kinds_with_option(name: str) -> dict[str, Any]:
    """The registered kinds whose options have a field `name`, each with that field's default (for "only generate
    jobs take it", and to let a field left at its default pass)."""
    load_kinds()
    found = {}
    for k, kind in sorted(_KINDS.items()):
        for f in fields(kind.options):
            if f.name == name:
                found[k] = f.default if f.default is not MISSING else None
    return found
