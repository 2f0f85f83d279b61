"""A plain-text progress bar on stderr for the models CLI.

Redraws in place on a terminal and prints a line every few seconds
otherwise, so logs of child processes stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """`update(done)` with done in [0, total]; `close()` ends the line."""

    def __init__(self, total: float, label: str, *, unit: str = "", scale: float = 1.0, stream: TextIO | None = None):
        stream = sys.stderr if stream is None else stream  # looked up now: sys.stderr may be replaced after import
        self.total, self.label, self.unit, self.scale, self.stream = total, label, unit, scale, stream
        self.done = 0.0
        self._tty = stream.isatty()
        self._start = time.monotonic()
        self._last = 0.0

    def advance(self, amount: float) -> None:
        self.update(self.done + amount)

    def update(self, done: float, note: str = "") -> None:
        self.done = done
        now = time.monotonic()
        if now - self._last < (0.2 if self._tty else 5.0) and done < self.total:
            return
        self._last = now
        frac = min(done / self.total, 1.0) if self.total else 1.0
        bar = "#" * int(frac * 30)
        rate = done / self.scale / max(now - self._start, 1e-9)
        text = (
            f"{self.label} [{bar:<30}] {frac * 100:5.1f}% {done / self.scale:.1f}/{self.total / self.scale:.1f}{self.unit}"
            f" {rate:.2f}{self.unit}/s {note}"
        )
        self.stream.write(("\r" + text) if self._tty else (text + "\n"))
        self.stream.flush()

    def close(self) -> None:
        self.update(self.total)
        if self._tty:
            self.stream.write("\n")

