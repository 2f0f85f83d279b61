"""Exceptions raised by the loader. Every message names the file, the tensor
and what was expected, so a user can act on one line."""

from __future__ import annotations

from core.echo import NAME_LIMIT

SHOWN_PROBLEMS = 10
"""Problems one error lists before "and N more": a crafted checkpoint has as many as it likes."""
PROBLEM_LIMIT = 8 * NAME_LIMIT
"""Characters of one listed problem; a longer one is cut with its length (its names are quoted already,
by `core.echo`)."""
SIGBUS_MEANING = "the file changed or shrank while it was being read (a shard truncated or rewritten during the load)"
"""What a load killed by SIGBUS most likely means: a mapped shard lost pages under it (drain, retain)."""


def _cut(problem: str) -> str:
    """A problem as an error lists it: at most `PROBLEM_LIMIT` characters, a cut one saying how long it was."""
    return problem if len(problem) <= PROBLEM_LIMIT else f"{problem[:PROBLEM_LIMIT]}... ({len(problem)} characters)"


def first_of(items: list[str], count: int = SHOWN_PROBLEMS) -> list[str]:
    """The first `count` of `items`, each cut to `PROBLEM_LIMIT`, then "and N more" when some were left out."""
    shown = [_cut(item) for item in items[:count]]
    return shown + [f"and {len(items) - count} more"] if len(items) > count else shown



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
        self.total = len(problems)
        """How many problems were found; `problems` lists the first SHOWN_PROBLEMS and "and N more"."""
        self.problems = first_of(sorted(problems) if len(problems) > 1 else list(problems))
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{self.total} problems:\n  " + "\n  ".join(self.problems)
        super().__init__(message)

    def messages(self) -> list[str]:
        return list(self.problems)


class PlacementError(DrainboardError):
    """Tensors could not be placed into the module (missing keys, shape or dtype mismatch)."""


class DeviceError(DrainboardError):
    """A device spec is malformed or names a device that is not present."""


class DiskFullError(DrainboardError):
    """A write would not fit, or ran out of space (ENOSPC): names the file or folder and the bytes."""
