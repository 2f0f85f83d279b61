"""The one dtype vocabulary of every CLI, the job spec, the Run page and the loader, torch-free.

Every command accepts the short and the long names (`bf16` and `bfloat16`, `fp16`, `float16` and `half`,
`fp32`, `float32` and `float`) and prints the long one, torch's own (`bfloat16`), which stored job specs
and load reports carry. A dtype is one `register_dtype` line here; the CLIs' `--dtype`, the Run page's
dtype control, the job spec and the loader's `parse_dtype` all read this registry.
"""

from __future__ import annotations

from core.echo import echo
from core.plugins import load_plugins

DTYPE_ALIASES: dict[str, str] = {}
"""Every accepted name (lower case) -> the name printed."""
_SHORT: dict[str, str] = {}
"""Printed name -> the short name help quotes for it (`bf16`), for those that have one."""


def register_dtype(name: str, *aliases: str) -> None:
    """Accept `name` (torch's attribute name: `torch.<name>` is the dtype) and its `aliases` everywhere; a name
    taken already is an error."""
    for alias in (name, *aliases):
        if alias.lower() in DTYPE_ALIASES:
            raise ValueError(f"dtype name {alias!r} is already registered for {DTYPE_ALIASES[alias.lower()]!r}")
    DTYPE_ALIASES.update({alias.lower(): name for alias in (name, *aliases)})
    if aliases:
        _SHORT[name] = aliases[0]


register_dtype("bfloat16", "bf16")
register_dtype("float16", "fp16", "half")
register_dtype("float32", "fp32", "float")


def dtype_aliases() -> dict[str, str]:
    """Every accepted name (lower case) -> the name printed, the plugins' included (`core.plugins`)."""
    load_plugins()
    return DTYPE_ALIASES


def dtype_names() -> tuple[str, ...]:
    """The names printed, torch's (`str(torch.bfloat16)` without `torch.`), in registration order."""
    return tuple(dict.fromkeys(dtype_aliases().values()))


def dtype_help() -> str:
    """How a `--dtype` option's help names its values: `bfloat16, float16 or float32 (bf16, fp16, fp32 too)`."""
    names = dtype_names()
    listed = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
    short = [_SHORT[name] for name in names if name in _SHORT]
    return listed + (f" ({', '.join(short)} too)" if short else "")


def dtype_name(text: str) -> str:
    """The printed name of any accepted dtype name; ValueError naming the known ones otherwise."""
    aliases = dtype_aliases()
    name = aliases.get(text.strip().lower()) if isinstance(text, str) else None
    if name is None:
        raise ValueError(f"unknown dtype {echo(text)}; known: {', '.join(aliases)}")
    return name
