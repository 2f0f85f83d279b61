"""Quoting user input back in a message, bounded: a crafted 26 KB value must not become a 26 KB line.

`echo("a" * 30000)` gives `'aaaa…aaa' (30,000 characters)`: the start and end of the value's repr,
with its length, so the user still recognises what was typed.
"""

from __future__ import annotations

ECHO_LIMIT = 60
"""The most characters of a value's repr any message quotes."""


def echo(value: object, limit: int = ECHO_LIMIT) -> str:
    """`repr(value)`, cut in the middle to at most about `limit` characters, its length said when cut."""
    text = repr(value)
    if len(text) <= limit:
        return text
    head = text[: limit * 2 // 3]
    tail = text[-(limit // 3):]
    size = f" ({len(value):,} characters)" if isinstance(value, str) else ""
    return f"{head}…{tail}{size}"
