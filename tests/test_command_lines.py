"""Every command of every CLI has help with an example, and the example is a command line the CLI accepts."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

import jobs.cli
import loader.cli
import models.cli
from core.command_line import UsageError

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


@pytest.mark.parametrize("cli", PARSERS)
def test_every_top_level_help_ends_with_examples_that_parse(cli):
    help_text = PARSERS[cli]().format_help()
    tail = help_text.rstrip().splitlines()[-1].strip()
    assert tail.startswith(f"python -m {cli} "), help_text
    examples = re.findall(rf"^\s+python -m {cli} (.*)$", help_text[help_text.rindex("examples:"):], flags=re.MULTILINE)
    for example in examples:
        assert callable(PARSERS[cli]().parse_args(shlex.split(example)).func), example


DTYPE_COMMANDS = [("jobs", ["submit", "load", "--model", "m"]), ("loader", ["load", "p"]), ("loader", ["forecast", "p"]),
                  ("models", ["generate", "m", "--prompt", "p", "--out", "o.mp4"]), ("models", ["synth", "o"])]


@pytest.mark.parametrize("cli, argv", DTYPE_COMMANDS, ids=[" ".join((c, a[0])) for c, a in DTYPE_COMMANDS])
def test_every_dtype_option_takes_short_and_long_names_and_gives_one(cli, argv):
    for short, long in (("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")):
        assert {PARSERS[cli]().parse_args([*argv, "--dtype", name]).dtype for name in (short, long, long.upper())} == {long}


OFFLOAD_COMMANDS = [("jobs", ["submit", "generate", "--model", "m", "--prompt", "p"]),
                    ("models", ["generate", "m", "--prompt", "p", "--out", "o.mp4"])]


@pytest.mark.parametrize("cli, argv", OFFLOAD_COMMANDS, ids=[c for c, _ in OFFLOAD_COMMANDS])
def test_offload_is_set_the_same_way_in_every_command(cli, argv):
    parse = PARSERS[cli]().parse_args
    assert parse(argv).offload == {}
    flags = parse([*argv, "--offload", "all=off", "--offload", "pin_cpu_memory=on"]).offload
    assert flags["dit_cpu_offload"] is False and flags["pin_cpu_memory"] is True
    with pytest.raises(UsageError, match="expected FLAG=on or FLAG=off"):
        parse([*argv, "--offload", "dit_cpu_ofload=off"])


@pytest.mark.parametrize("cli, argv", OFFLOAD_COMMANDS, ids=[c for c, _ in OFFLOAD_COMMANDS])
def test_no_command_offers_a_flag_that_must_stay_fixed_and_steps_default_to_50(cli, argv):
    parser = dict(commands(PARSERS[cli]()))[tuple(argv[: 2 if cli == "jobs" else 1])]
    for fixed in ("--guidance-scale", "--fps", "--negative-prompt"):
        with pytest.raises(UsageError):
            PARSERS[cli]().parse_args([*argv, fixed, "1"])
    steps = next(a for a in parser._actions if "--steps" in a.option_strings)
    assert "50" in steps.help or steps.default == 50
