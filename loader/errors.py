"""Exceptions raised by the loader. Every message names the file, the tensor
and what was expected, so a user can act on one line."""

from __future__ import annotations


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
