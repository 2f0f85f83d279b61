"""Every command of every CLI has help with an example, and the example is a command line the CLI accepts."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

import jobs.cli
import loader.cli
import models.cli

PARSERS = {"jobs": jobs.cli.build_parser, "loader": loader.cli.build_parser, "models": models.cli.build_parser}


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) of every leaf command, e.g. (("submit", "load"), <parser>)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from commands(sub, (*path, name))


CASES = [(cli, path) for cli, build in PARSERS.items() for path, _ in commands(build())]


def test_every_cli_is_covered():
    assert {("jobs", ("submit", "load")), ("jobs", ("worker",)), ("loader", ("device",)),
            ("models", ("synth",))} <= set(CASES)


@pytest.mark.parametrize("cli, path", CASES, ids=[" ".join((c, *p)) for c, p in CASES])
def test_every_command_has_help_with_an_example_that_parses(cli, path):
    parser = dict(commands(PARSERS[cli]()))[path]
    help_text = parser.format_help()
    tail = help_text[help_text.index("example"):] if "example" in help_text else ""
    examples = re.findall(rf"python -m {cli} ([^\n]*?)(?:\s{{2,}}\(.*)?$", tail, flags=re.MULTILINE)
    assert examples, f"python -m {cli} {' '.join(path)} --help has no example:\n{help_text}"
    for example in examples:
        words = shlex.split(example)
        assert tuple(words[: len(path)]) == path, example
        args = PARSERS[cli]().parse_args(words)  # a usage error raises UsageError and fails the test
        assert callable(args.func)
