"""Which placement mode suits which device: a warning where the mode asked for is known to be slow there.

A mode whose reads go through mmap views (`Placement.uses_mmap`: `drain`,
`retain`) is slow on unified memory (a DGX Spark): public reports put
mmap-based loading several times slower than plain reads (this project has
not measured it on a Spark), so the CLIs and the Run page say so when one is
picked; `stream`, the default, reads without mmap.
"""

from __future__ import annotations

import sys

from core.errors import DeviceError
from machine.device import DeviceInfo, probe_device
from .base import placement_class


def mode_warning(mode: str, info: DeviceInfo | None) -> str | None:
    """One line warning against `mode` (a registered one) on the CUDA device `info` describes (None: no device
    known), or None. A CPU target counts as unified too, but there mmap views are how `drain` is meant to run."""
    if not placement_class(mode).uses_mmap or info is None or info.kind != "cuda" or not info.unified_memory:
        return None
    return (f"warning: mode {mode} reads through mmap views, and mmap-staged reads are slow on unified memory "
            f"({info.name or info.spec}, e.g. a DGX Spark); stream, the default, reads without mmap")


def warn_about_mode(mode: str, device: str) -> None:
    """Print `mode_warning` for `device` (a spec such as `cuda:0`) on stderr, if any (for the CLIs)."""
    try:
        info = probe_device(device)
    except DeviceError:  # a bad spec: the load itself reports it
        return
    warning = mode_warning(mode, info)
    if warning:
        print(warning, file=sys.stderr)
