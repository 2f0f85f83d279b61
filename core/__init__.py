"""Drainboard's foundation, shared by every part: the error types, the one command-line main,
sizes, disk space, bounded JSON, quoting of user input and the dtype vocabulary.

Standard library only (no torch), so listing jobs or reading settings costs no heavy import.
"""

from .errors import CheckpointError, DeviceError, DiskFullError, DrainboardError, PlacementError

__all__ = ["CheckpointError", "DeviceError", "DiskFullError", "DrainboardError", "PlacementError"]
