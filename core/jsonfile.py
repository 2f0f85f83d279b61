"""Bounded JSON: every JSON the loader parses (headers, index files, configs) has a size and a
nesting limit, so a crafted file ends in one CheckpointError naming it, never a RecursionError."""

from __future__ import annotations

import json
import sys

from .echo import echo

MAX_JSON_BYTES = 64 * 1024 * 1024
"""Largest side file (index, config, model index) read; real ones are a few MB at most."""
MAX_JSON_DEPTH = 64
"""Deepest nesting accepted; checkpoint JSON is a handful of levels deep."""


class JSONProblem(ValueError):
    """Why a JSON text was refused; the message never quotes the text."""


def parse_json(raw: bytes | str, *, strict: bool = False, bound_depth: bool = True) -> object:
    """Parse `raw`, refusing invalid UTF-8, invalid JSON and nesting deeper than MAX_JSON_DEPTH.

    `strict` reads the text as safetensors' own parser (serde_json) does, where
    Python's is lenient: a key given twice in one object is refused (Python keeps
    the last silently, so two readers could see two different files), and `-0` is
    the float -0.0, not the integer 0 (so a header's offset or dimension of `-0`
    is refused as not an integer).

    Without `bound_depth` the nesting is bounded only by the parser's recursion limit (a RecursionError is
    still this JSONProblem): for a caller that reads two levels and never recurses, which skips the scan.
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise JSONProblem(f"not valid UTF-8 (byte {exc.start})") from None
    hooks = {}
    if strict:
        hooks["object_pairs_hook"] = _unique_keys
        if "-0" in text:  # the hook costs a call per integer: only a text that could hold -0 pays it
            hooks["parse_int"] = _int_or_negative_zero
    try:
        value = json.loads(text, **hooks)
    except json.JSONDecodeError as exc:
        raise JSONProblem(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except _DuplicateKey as exc:
        raise JSONProblem(f"ambiguous: it gives the key {echo(exc.key)} twice in one object") from None
    except RecursionError:
        raise JSONProblem(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError:  # Python's int-string limit: a number of thousands of digits
        raise JSONProblem(f"not usable: it holds a number of more than {sys.get_int_max_str_digits()} digits") from None
    if bound_depth and _depth(value) > MAX_JSON_DEPTH:
        raise JSONProblem(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return value


def _int_or_negative_zero(text: str) -> int | float:
    return -0.0 if text == "-0" else int(text)


def _depth(value: object) -> int:
    """Nesting depth of a parsed value, iteratively (a deep value must not recurse here either).

    Only containers go on the stack: a shard header is mostly short lists of
    integers, and stacking each integer made this scan cost three times the
    parse itself.
    """
    containers = (dict, list)  # exactly what json.loads builds
    deepest = 0
    stack = [(value, 1)] if type(value) in containers else []
    while stack:
        item, level = stack.pop()
        if level > deepest:
            deepest = level
            if deepest > MAX_JSON_DEPTH:
                return deepest
        for child in item.values() if type(item) is dict else item:
            if type(child) in containers:
                stack.append((child, level + 1))
    return deepest
