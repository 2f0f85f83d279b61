"""Exceptions raised by the loader. Every message names the file, the tensor
and what was expected, so a user can act on one line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence


class DrainboardError(Exception):
    """Base of every error Drainboard raises on purpose (bad input, not bugs)."""

    def messages(self) -> list[str]:
        """Every problem as one line; subclasses that collect several list them all."""
        return [str(self)]


class CheckpointError(DrainboardError):
    """A checkpoint is missing, malformed, truncated or inconsistent."""

    def __init__(self, problems: list[str] | str):
        if isinstance(problems, str):
            problems = [problems]
        self.problems = sorted(problems) if len(problems) > 1 else list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{len(self.problems)} problems:\n  " + "\n  ".join(self.problems)
        super().__init__(message)

    def messages(self) -> list[str]:
        return list(self.problems)


class PlacementError(DrainboardError):
    """Tensors could not be placed into the module (missing keys, shape or dtype mismatch)."""


class DeviceError(DrainboardError):
    """A device spec is malformed or names a device that is not present."""


class DiskFullError(DrainboardError):
    """A write would not fit, or ran out of space (ENOSPC): names the file or folder and the bytes."""


def run_cli(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, run the chosen subcommand's `func(args)`, and turn expected errors into exit 2."""
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except DrainboardError as exc:
        return report_error(exc, as_json=getattr(args, "json", False))


def report_error(exc: DrainboardError, *, as_json: bool) -> int:
    """Print an expected error the way every CLI does and return exit code 2.

    With `--json`: one object `{"ok": false, "error": ..., "errors": [...]}` on stdout;
    otherwise one `error: ...` line on stderr. Never a traceback.
    """
    problems = exc.messages()
    line = "; ".join(problems)
    if as_json:
        print(json.dumps({"ok": False, "error": line, "errors": problems}))
    else:
        print(f"error: {line}", file=sys.stderr)
    return 2
