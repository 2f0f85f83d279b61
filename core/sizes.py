"""The one size grammar: every option or setting that takes a number of bytes reads it here.

`parse_size("700MB")`, `parse_size("0.5GiB")`, `parse_size(4096)`. Units, case-insensitive:
`B`; decimal `KB` `MB` `GB` `TB` (10^3 .. 10^12, as disk sizes, safetensors shard sizes and the
GB/s throughput metric count), also written `K` `M` `G` `T`; binary `KiB` `MiB` `GiB` `TiB`
(2^10 .. 2^40, as memory is shown). A decimal fraction is exact (`1.5GB` is 1,500,000,000), a
fraction of a byte is dropped; exponents (`1e30`) are refused, and so is anything above 2^63 - 1.
Digits are ASCII only (`５GB` is refused). A refused text is quoted back bounded (`core.echo`).
Standard library (and `core.echo`, as plain) only, so anything may import it without pulling in torch.
"""

from __future__ import annotations

import re
from fractions import Fraction

from core.echo import echo

MAX_SIZE = 2**63 - 1
"""The largest size accepted: what SQLite, JSON readers and cgroup files all hold exactly."""

UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40,
}
"""Bytes per unit, by lower-case unit name."""

_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z]*)\s*", re.IGNORECASE | re.ASCII)
"""ASCII digits only: `\\d` would take `５GB` (full-width) or Arabic-Indic digits, which no setting means."""
_MIB = 2**20
_GIB = 2**30


class SizeError(ValueError):
    """A size could not be read, or lies outside the accepted range; the message says which and why."""


def parse_size(text: str | int, *, minimum: int = 1) -> int:
    """Bytes from a size such as `700MB`, `4GiB`, `0.5GiB` or a plain integer.

    Raises `SizeError` (a ValueError) naming the text and what was expected;
    `minimum` (bytes) is the smallest size accepted, stated in the message.
    """
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise SizeError(f"{echo(text)} is not a size; expected a number of bytes or text such as 700MB or 4GiB")
    if isinstance(text, int):
        size = text
    else:
        match = _SIZE.fullmatch(text)
        unit = match.group(2).lower() if match else None
        if text.strip().startswith("-"):
            raise SizeError(f"{echo(text)} is negative; a size is a positive number of bytes")
        if match is None or unit not in UNITS:
            raise SizeError(
                f"{echo(text)} is not a size; expected a number with an optional unit: B, KB, MB, GB, TB"
                " (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), such as 700MB or 0.5GiB"
            )
        size = int(Fraction(match.group(1)) * UNITS[unit])
    if size < minimum:
        least = f"{minimum:,} byte" + ("s" if minimum != 1 else "")
        if minimum >= _MIB:
            least = f"{format_size(minimum)} ({least})"
        raise SizeError(f"{echo(text)} is too small; the minimum is {least}")
    if size > MAX_SIZE:
        raise SizeError(f"{echo(text)} is too large; the maximum is {MAX_SIZE:,} bytes")
    return size


def format_size(nbytes: int) -> str:
    """`512.0 MiB` under 1 GiB (so small limits never read `0.00 GiB`), `4.00 GiB` from 1 GiB, bytes under 1 MiB."""
    if abs(nbytes) < _MIB:
        return f"{nbytes:,} bytes"
    if abs(nbytes) < _GIB:
        return f"{nbytes / _MIB:.1f} MiB"
    return f"{nbytes / _GIB:.2f} GiB"
