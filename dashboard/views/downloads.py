"""What the Job page offers to download, bounded in the server's memory.

Streamlit 1.67's `download_button` holds whatever it offers as bytes in the
server (a file object or a callable's result is read whole into its media
store), so nothing streams: a 1 GiB worker log offered whole cost 1 GB of the
dashboard's memory per download. The log is offered from its end instead (the
end is where a failure is said), at most `LOG_OFFERED` bytes, and the page
says so with the whole file's path. A video is offered whole: a cut MP4 does
not play, and it is bounded by its frames.
"""

from __future__ import annotations

import os
from pathlib import Path

from dashboard import format as fmt

LOG_OFFERED = 8 * 2**20
"""Bytes of a worker log the download offers at most: its end."""


def log_tail(path: Path, limit: int = LOG_OFFERED) -> bytes:
    """The file whole when it holds at most `limit` bytes; else its last `limit` bytes, from the first line
    that starts within them. Reads only what it returns."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= limit:
            return f.read()
        f.seek(size - limit)
        tail = f.read(limit)
    cut = tail.find(b"\n")
    return tail[cut + 1:] if 0 <= cut < len(tail) - 1 else tail


def log_offer(name: str, size: int, path: Path, limit: int = LOG_OFFERED) -> tuple[str, str | None]:
    """(the button's label, the note under it: None when the whole log is offered)."""
    if size <= limit:
        return f"Worker log ({name}, {fmt.gib(size, 1)})", None
    return (f"Worker log ({name}, last {fmt.gib(limit, 1)})",
            f"The worker log {name} is {fmt.gib(size, 1)}: the download offers its last {fmt.gib(limit, 1)} "
            f"(where a failure is said). The whole file is on the server at {path}.")
