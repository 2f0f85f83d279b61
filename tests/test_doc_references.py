"""Every file path and every dotted name the docs and docstrings point a reader at still exists.

A move (a module into a package, a function into another module) leaves the prose behind it; these checks
find the stale pointer before a reader does.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

from tests.test_import_rules import PACKAGES, ROOT, source_files

PROSE = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(rf"\b(?:{'|'.join(PACKAGES)}|bench|tests)/[A-Za-z0-9_/.-]+\.(?:py|json|sh|md)\b")
DOTTED = re.compile(rf"`((?:{'|'.join(PACKAGES)})\.[A-Za-z0-9_.]+)")


def _texts() -> dict[Path, str]:
    return {p: p.read_text() for p in [*PROSE, *source_files().values()]}


def _resolves(dotted: str) -> bool:
    """`a.b.c` names a module, or an attribute (a dataclass field included) of the longest module prefix."""
    parts = dotted.rstrip(".").split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            fields = dataclasses.fields(found) if dataclasses.is_dataclass(found) else ()
            if hasattr(found, name):
                found = getattr(found, name)
            elif name in {f.name for f in fields} and name == parts[-1]:
                return True
            else:
                return False
        return True
    return False


def test_every_path_the_prose_names_exists():
    missing = {f"{p.relative_to(ROOT)}: {m}" for p, text in _texts().items() for m in PATH.findall(text)
               if not (ROOT / m).exists()}
    assert not missing, sorted(missing)


def test_every_dotted_name_in_backticks_resolves():
    stale = {f"{p.relative_to(ROOT)}: {m}" for p, text in _texts().items() for m in DOTTED.findall(text)
             if not _resolves(m)}
    assert not stale, sorted(stale)
