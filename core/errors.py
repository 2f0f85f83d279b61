"""Exceptions raised by the loader. Every message names the file, the tensor
and what was expected, so a user can act on one line."""

from __future__ import annotations

SHOWN_PROBLEMS = 10
"""Problems one error lists before "and N more": a crafted checkpoint has as many as it likes."""
MAX_NAME_SHOWN = 120
"""Characters of a name (tensor, file) a message quotes; a longer one is cut with its length."""
SIGBUS_MEANING = "the file changed or shrank while it was being read (a shard truncated or rewritten during the load)"
"""What a load killed by SIGBUS most likely means: a mapped shard lost pages under it (drain, retain)."""


def clip(text: str, limit: int = MAX_NAME_SHOWN) -> str:
    """`text` as a message may quote it: at most `limit` characters, a cut one saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def first_of(items: list[str], count: int = SHOWN_PROBLEMS) -> list[str]:
    """The first `count` of `items`, each clipped, then "and N more" when some were left out."""
    shown = [clip(item, 8 * MAX_NAME_SHOWN) for item in items[:count]]
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
