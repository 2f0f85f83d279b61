"""docs/architecture.md's "Who may import whom", held against every import in the product's source.

Imports inside functions count as much as those at the top: a circle through a lazy import is still a circle
(two modules that each need the other to be understood), and an upward import in a function still inverts
the layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "machine", "loader", "drainboard_plugins", "models", "storage", "jobs", "dashboard")
LAYER = {"app": 1, "dashboard": 2, "jobs": 3, "models": 4, "storage": 4, "drainboard_plugins": 4, "loader": 5,
         "machine": 6, "core": 7}
"""Each package's line in "Who may import whom": a package imports only lines below its own."""
SAME_LINE = {("drainboard_plugins", "models")}
"""The one import within a line the doc names: the repository's plugin imports `models` to register its classes."""


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every package of the product and `app.py`."""
    files = {_module_name(p, root): p for package in PACKAGES for p in (root / package).rglob("*.py")}
    files["app"] = root / "app.py"
    return files


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the product modules it imports anywhere in its file (`from . import x` counts as `x`)."""

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                found.update(known(f"{base}.{alias.name}") if f"{base}.{alias.name}" in files else known(base)
                             for alias in node.names)
        graph[module] = {m for m in found if m is not None and m != module}
    return graph


def importers_of(library: str, files: dict[str, Path]) -> list[str]:
    """The modules that import `library` (or any of its submodules) anywhere in their file."""
    found = []
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == library or n.startswith(library + ".") for n in names):
                found.append(module)
                break
    return sorted(found)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for each import of a package on the same line or a line above (SAME_LINE excepted)."""
    wrong = []
    for module, targets in graph.items():
        own = module.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            if other != own and LAYER[other] <= LAYER[own] and (own, other) not in SAME_LINE:
                wrong.append(f"{module} -> {target}")
    return sorted(wrong)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(source_files())


def test_no_module_imports_its_way_back_to_itself(graph):
    assert circles(graph) == []


def test_every_import_goes_down_the_lines_of_the_architecture(graph):
    assert upward_imports(graph) == []


def test_outside_the_loader_nothing_imports_loader_io(graph):
    assert sorted(f"{m} -> {t}" for m, t in ((m, t) for m in graph for t in graph[m])
                  if t.startswith("loader.io") and not m.startswith("loader")) == []


def test_only_the_pages_import_streamlit():
    """`app.py` and `dashboard/` only, and there neither the views (plain functions of rows) nor the chart
    builders (pure functions of frames): a test or another page can call those without a Streamlit runtime."""
    users = importers_of("streamlit", source_files())
    assert [m for m in users if m != "app" and not m.startswith("dashboard.")] == []
    assert [m for m in users if m.startswith(("dashboard.views", "dashboard.charts"))] == []


def test_the_checks_find_a_circle_through_a_lazy_import_and_an_upward_import(tmp_path):
    """The rules above, run on a throwaway tree that breaks them, fail."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "a.py").write_text("from .b import X\n")
    (tmp_path / "models" / "b.py").write_text("def f():\n    from . import a\n    from jobs import spec\n")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "__init__.py").write_text("")
    (tmp_path / "jobs" / "spec.py").write_text("")
    files = {_module_name(p, tmp_path): p for p in tmp_path.rglob("*.py")}
    graph = import_graph(files)
    assert circles(graph) == [["models.a", "models.b"]]
    assert upward_imports(graph) == ["models.b -> jobs.spec"]
