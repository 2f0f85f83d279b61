"""Quoting input back in a message, bounded and escaped: the one way a value a user typed, or a name read
from a file (tensor, shard, component, config key, class), reaches a terminal, a log or a page.

`echo("a" * 30000)` gives `'aaaa…aaa' (30,000 characters)`: the start and end of the value's repr,
with its length, so the user still recognises what was typed. The repr escapes every control character
(a newline cannot forge a second line, `\\x1b]0;…\\x07` cannot retitle a terminal) and every character
that does not print.
"""

from __future__ import annotations

ECHO_LIMIT = 60
"""The most characters of a value's repr any message quotes."""
NAME_LIMIT = 120
"""The most characters of a name's repr a message quotes (names are longer than typed values)."""


def echo(value: object, limit: int = ECHO_LIMIT) -> str:
    """`repr(value)`, cut in the middle to at most about `limit` characters, its length said when cut."""
    text = repr(value)
    if len(text) <= limit:
        return text
    head = text[: limit * 2 // 3]
    tail = text[-(limit // 3):]
    size = f" ({len(value):,} characters)" if isinstance(value, str) else ""
    return f"{head}…{tail}{size}"


def echo_name(name: object, limit: int = NAME_LIMIT) -> str:
    """A name read from a file (a file or folder name, a path, a component, class or tensor name) where the
    message frames it itself (a label before a colon, backticks): as it is when short and printable
    (`transformer/config.json` reads as written), else `echo`ed with `limit` (escaped, bounded). Where
    the message does not frame it, a name is quoted: `echo(name, NAME_LIMIT)`."""
    text = name if isinstance(name, str) else str(name)
    return text if len(text) <= limit and text.isprintable() else echo(text, limit)
