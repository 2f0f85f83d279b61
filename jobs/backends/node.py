"""The Ray job's entrypoint on its node: `python -m jobs.backends.node JOB_ID` runs the job child and writes
the job's log, its records as tagged lines and its output as plain lines, every line bounded.

The child reports over a pipe of its own (`jobs.wire.ENV_RECORD_FD`), never through its stdout or
stderr, and never sees the job's secret: this process takes the nonce out of its environment before the
child starts, and is the only writer of tagged lines. The child's stdout and stderr (one pipe) become
plain lines cut at `OUTPUT_LINE_LIMIT`; a record line over `LINE_LIMIT` is dropped and said (`dropped`).
Last comes the `exit` record, the child's exit code as `subprocess.Popen` gives it (negative: the signal
that ended it), and this process exits with it (128 + n for signal n, as a shell says it).

A SIGTERM here (Ray's `stop_job`, or anyone's) is passed to the child, whose own SIGTERM is its stop; this
process keeps writing the log until the child is gone. It dies with its parent (Ray's job supervisor),
and the child dies with it.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Callable

from jobs.wire import ENV_NONCE, ENV_RECORD_FD, LINE_LIMIT, OUTPUT_LINE_LIMIT, encode, tag

DRAIN_AFTER_EXIT = 2.0
"""Seconds the log is still read after the child exited, while a process it started holds a pipe open."""


class LineCutter:
    """Splits a byte stream into lines of at most `limit` bytes (newline excluded).

    `feed` returns (line, cut) pairs: `cut` when the line was longer, `line` then holding its first
    `limit` bytes; the rest of it is skipped up to its newline."""

    def __init__(self, limit: int):
        self.limit = limit
        self._buffer = bytearray()
        self._skipping = False

    def feed(self, data: bytes) -> list[tuple[bytes, bool]]:
        self._buffer += data
        lines = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                if len(self._buffer) > self.limit:
                    if not self._skipping:
                        lines.append((bytes(self._buffer[:self.limit]), True))
                        self._skipping = True
                    self._buffer.clear()
                return lines
            if self._skipping:
                self._skipping = False
            elif end > self.limit:
                lines.append((bytes(self._buffer[:self.limit]), True))
            else:
                lines.append((bytes(self._buffer[:end]), False))
            del self._buffer[:end + 1]

    def rest(self) -> bytes:
        """What is left without a newline at the stream's end (empty while a cut line is being skipped)."""
        return b"" if self._skipping else bytes(self._buffer)


def relay(job_id: int, nonce: str, command: list[str], env: dict[str, str], out: int = 1) -> int:
    """Run `command` (the job child) with a record pipe, write the job's log to `out`; the child's exit code."""
    record_read, record_write = os.pipe()
    child = subprocess.Popen(command, env={**env, ENV_RECORD_FD: str(record_write)}, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(record_write,))
    os.close(record_write)
    signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signal.SIGTERM))
    prefix = tag(job_id, nonce).encode()

    def write(line: bytes) -> None:
        view = memoryview(line)
        while view:
            view = view[os.write(out, view):]

    def output(line: bytes, cut: bool) -> None:
        write(line + (f" [... cut: a line over {OUTPUT_LINE_LIMIT:,} bytes]".encode() if cut else b"") + b"\n")

    def record(line: bytes, cut: bool) -> None:
        write(prefix + (encode("dropped", {"limit": LINE_LIMIT}) if cut else line + b"\n"))

    streams: dict[int, tuple[LineCutter, Callable[[bytes, bool], None]]] = {
        child.stdout.fileno(): (LineCutter(OUTPUT_LINE_LIMIT), output),
        record_read: (LineCutter(LINE_LIMIT), record),
    }
    selector = selectors.DefaultSelector()
    for fd in streams:
        selector.register(fd, selectors.EVENT_READ)
    exited_at = None
    while streams:
        ready = selector.select(0.2)
        for key, _ in ready:
            cutter, handle = streams[key.fd]
            data = os.read(key.fd, 1 << 16)
            for line, cut in cutter.feed(data):
                handle(line, cut)
            if not data:
                selector.unregister(key.fd)
                del streams[key.fd]
                if handle is output and cutter.rest():
                    output(cutter.rest(), False)  # a record cut short by a kill is nothing to keep
        if child.poll() is not None:
            exited_at = exited_at or time.monotonic()
            if not ready and time.monotonic() - exited_at > DRAIN_AFTER_EXIT:
                break
    selector.close()
    code = child.wait()
    write(prefix + encode("exit", code))
    return code


def main(job_id: int) -> int:
    from machine.lifetime import die_with_parent

    die_with_parent()
    nonce = os.environ.pop(ENV_NONCE)
    code = relay(job_id, nonce, [sys.executable, "-m", "jobs.child", str(job_id)], dict(os.environ))
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        print("usage: python -m jobs.backends.node JOB_ID", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(int(sys.argv[1])))
