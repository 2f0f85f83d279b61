"""The one `main` every Drainboard command line runs through (`python -m loader|models|jobs`).

`run_cli(parser, argv)` parses, runs the chosen subcommand's `func(args)` and
keeps the contract the README states for every CLI:

- bad input (a `DrainboardError`, or a usage error argparse found) prints one
  line and exits 2; with `--json` stdout holds exactly the object
  `{"ok": false, "error": ..., "errors": [...]}`, usage errors included;
- anything unexpected exits 1 (the traceback on stderr, the same JSON object on
  stdout with `--json`);
- a reader that closes stdout early (`| head`) ends the command quietly.

Parsers are built with `CliParser`, so their subparsers raise `UsageError`
instead of printing usage and exiting. `--dtype`, which every CLI shares, is
spelled here once (`dtype_type`, `core.dtype_names`); `--offload FLAG=on|off`
lives beside the flags it names (`machine.offload_option`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from typing import Callable, NoReturn, Sequence

from .dtype_names import dtype_name
from .errors import DrainboardError
from .sizes import parse_size

EXIT_BAD_INPUT = 2
"""Exit code for bad input: a usage error, an invalid value, a malformed checkpoint."""
EXIT_UNEXPECTED = 1
"""Exit code for anything unexpected (a bug, an unreadable disk)."""
EXIT_CLOSED_STDOUT = 141
"""Exit code when the reader closed stdout: 128 + SIGPIPE, what `cat` or `yes` end with in `| head`."""


class UsageError(DrainboardError):
    """The command line itself is wrong: an unknown option, a missing argument, a value outside its choices."""

    def __init__(self, message: str, usage: str):
        self.usage = usage
        """The parser's usage line, printed above the error when the output is not JSON."""
        super().__init__(message)


class CliParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are raised as `UsageError` (so `--json` can report them as JSON).

    Subparsers made with `add_subparsers` are CliParsers too; help keeps its line breaks (examples).
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}", self.format_usage())


class DeferredText:
    """Text made only when a help page is printed, placed in an option's help as `%(name)s` with the option's
    `name` attribute set to it: a command that must start light (`jobs list`) can describe what a heavy registry
    holds (the placement modes import torch) without importing it to parse."""

    def __init__(self, make: Callable[[], str]):
        self._make = make

    def __str__(self) -> str:
        return self._make()


def size_type(*, minimum: int = 1) -> Callable[[str], int]:
    """An argparse `type=` for sizes (`core.sizes` grammar): a bad size is a usage error naming the option."""

    def parse(text: str) -> int:
        try:
            return parse_size(text, minimum=minimum)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "size"
    return parse


ParserSource = argparse.ArgumentParser | Callable[[], argparse.ArgumentParser]
"""A parser, or the function building it: one whose choices read settings (the job kinds a setting names)
is built inside `run_cli`, so a bad setting is reported like any bad input."""


def dtype_type(text: str) -> str:
    """An argparse `type=` for `--dtype`: any accepted name (`bf16`, `bfloat16`, ...) to the one printed."""
    try:
        return dtype_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


IMPORT_CHATTER = ("torchao", "diffusers.quantizers.torchao", "torch.utils._pytree")
"""Loggers that warn while diffusers imports an installed torchao (kernels built for another torch, tensor
types it cannot register): five lines before a command's own one-line error. Errors still show."""


def quiet_import_chatter() -> None:
    """Raise `IMPORT_CHATTER`'s loggers to errors: every CLI's main and every job child (whose log would
    otherwise start with them) calls this before anything imports diffusers."""
    for name in IMPORT_CHATTER:
        logging.getLogger(name).setLevel(logging.ERROR)


def run_cli(parser: ParserSource, argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default `sys.argv[1:]`), run `args.func(args)`, and return the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    quiet_import_chatter()
    options = argv[: argv.index("--")] if "--" in argv else argv
    try:
        return _run(parser, argv, as_json="--json" in options)
    except BrokenPipeError:
        return _closed_stdout()


def _run(parser: ParserSource, argv: list[str], *, as_json: bool) -> int:
    try:
        if not isinstance(parser, argparse.ArgumentParser):
            parser = parser()
        args = parser.parse_args(argv)
        as_json = bool(getattr(args, "json", False))
        code = args.func(args)
        sys.stdout.flush()  # a closed stdout fails here, not in the interpreter's last flush
        return code
    except DrainboardError as exc:
        return report_error(exc, as_json=as_json)
    except BrokenPipeError:
        raise
    except Exception as exc:
        return _report_unexpected(exc, as_json=as_json)


def report_error(exc: DrainboardError, *, as_json: bool) -> int:
    """Print an expected error the way every CLI does and return exit code 2.

    With `--json`: one object `{"ok": false, "error": ..., "errors": [...]}` on stdout;
    otherwise one `error: ...` line on stderr (below the usage line for a usage error). Never a traceback.
    """
    problems = exc.messages()
    line = "; ".join(problems)
    if as_json:
        print(json.dumps({"ok": False, "error": line, "errors": problems}))
    else:
        if isinstance(exc, UsageError):
            sys.stderr.write(exc.usage)
        print(f"error: {line}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _report_unexpected(exc: Exception, *, as_json: bool) -> int:
    traceback.print_exc()
    line = f"{type(exc).__name__}: {exc}"
    if as_json:
        print(json.dumps({"ok": False, "error": line, "errors": [line]}))
    print(f"unexpected error: {line}", file=sys.stderr)
    return EXIT_UNEXPECTED


def _closed_stdout() -> int:
    """The reader went away: point stdout at /dev/null so the interpreter's last flush stays quiet."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_CLOSED_STDOUT
