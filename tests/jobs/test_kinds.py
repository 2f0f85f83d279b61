import inspect
from pathlib import Path

from jobs.kinds import get_kind, kind_names

TESTS = Path(__file__).parent
TEST_KINDS_MODULE = "tests.jobs.kinds_for_tests"


def test_every_built_in_kind_has_a_docstring_and_a_test_named_for_it(monkeypatch):
    monkeypatch.delenv("DRAINBOARD_KIND_MODULES", raising=False)
    sources = "\n".join(p.read_text() for p in TESTS.glob("test_*.py"))
    names = [n for n in kind_names() if get_kind(n).__module__ != TEST_KINDS_MODULE]
    assert {"generate", "load"} <= set(names)
    for name in names:
        assert inspect.getdoc(get_kind(name)), f"job kind {name!r} has no docstring"
        assert f"def test_kind_{name}" in sources, f"job kind {name!r} has no test_kind_{name}"
