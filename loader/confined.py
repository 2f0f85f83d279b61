"""Opening a checkpoint file so the model-root check holds at open time, not only at discovery.

A path checked once and opened later by name can be swapped in between (a
shard replaced by a link to a file outside the roots while a load runs). So
every file a checkpoint names is opened here, and only here:

- its real path is found and checked under a root (`ModelRoots`), then opened
  by walking that path down from the root's descriptor one component at a
  time with `O_NOFOLLOW`: a link put in anywhere after the check makes the
  open fail instead of leading outside. A Hugging Face snapshot's link into
  its own repository's `blobs/` is the one link followed: it is resolved and
  checked to stay in that `models--*` folder (`ModelRoots.locate`), and the
  walk to the blob starts from the repository folder, so what is opened is
  the checked blob whatever the link says by then;
- with `O_NONBLOCK`, and `fstat` must show a regular file: a FIFO, socket or
  device named like a shard is refused with one line instead of hanging;
- discovery records what it opened (`CheckedFile`: device, inode, size); a
  load reopens through the same walk and refuses a file that is not the one
  validated (another inode), so headers and bytes come from the same file.

Hard links and bind mounts cannot be told from the real file by any of this:
a hard link inside a root to a file elsewhere is that file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from core import jsonfile
from core.echo import echo_name
from core.errors import CheckpointError
from .roots import ModelRoots, RootEscape

_BASE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | os.O_NOFOLLOW
MAX_NAME_CHARS = 255
"""Longest file name accepted from a checkpoint (a Linux file name's limit in bytes)."""

_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFDIR: "a folder", stat.S_IFLNK: "a link"}


@dataclass(frozen=True)
class CheckedFile:
    """A file discovery opened and validated: where it really is and which file it was."""

    real: Path
    """Its path with every link resolved, under `root`."""
    root: Path
    """The model root it lies under (resolved)."""
    device: int
    """`st_dev` when validated."""
    inode: int
    """`st_ino` when validated."""
    size: int
    """`st_size` when validated: a load reading less than this was cut short under it."""

    def open(self, name: str) -> int:
        """A descriptor of this same file (walked from the root again), or CheckpointError naming `name`."""
        fd, st = _open_walk(self.root, self.real, name)
        if (st.st_dev, st.st_ino) != (self.device, self.inode):
            os.close(fd)
            raise RootEscape(f"{name}: was replaced by another file after it was validated; refused")
        return fd


def open_checked(path: Path, roots: ModelRoots, name: str) -> tuple[int, CheckedFile]:
    """Open `path` confined to `roots` (see the module's docstring): its descriptor and what was opened."""
    check_name(path.name, name)
    try:
        real = Path(os.path.realpath(path))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{name}: cannot resolve: {exc}") from None
    root = roots.locate(path)
    if root is None:
        raise roots.escape(path, name)
    fd, st = _open_walk(root, real, name)
    return fd, CheckedFile(real, root, st.st_dev, st.st_ino, st.st_size)


def reopen(file: Path, checked: CheckedFile | None) -> int:
    """A load's descriptor of `file`: the validated file again (`checked`), or, for a shard described
    by hand (no discovery), `file` opened confined to its own folder."""
    name = echo_name(file.name)
    if checked is not None:
        return checked.open(name)
    return open_checked(file, ModelRoots([file.parent]), name)[0]


def read_checked(path: Path, roots: ModelRoots, name: str, limit: int) -> bytes:
    """At most `limit` + 1 bytes of `path`, opened with `open_checked` (one more, so a caller sees "too large")."""
    fd, _ = open_checked(path, roots, name)
    try:
        return read_at_most(fd, limit + 1)
    finally:
        os.close(fd)


def read_json_checked(path: Path, roots: ModelRoots | None = None, name: str | None = None) -> object:
    """A checkpoint's JSON file (config, index, model index) opened with `open_checked` (default root: its
    folder) and parsed with `jsonfile`'s bounds; any problem is one CheckpointError naming `name`."""
    name = name or echo_name(path)
    limit = jsonfile.MAX_JSON_BYTES
    raw = read_checked(path, roots or ModelRoots([path.parent]), name, limit)
    if len(raw) > limit:
        raise CheckpointError(f"{name}: larger than the {limit}-byte limit for a JSON file")
    try:
        return jsonfile.parse_json(raw)
    except jsonfile.JSONProblem as exc:
        raise CheckpointError(f"{name}: {exc}") from None


def read_at_most(fd: int, limit: int, offset: int = 0) -> bytes:
    """Up to `limit` bytes of `fd` from `offset` (fewer only at the end of the file)."""
    parts, done = [], 0
    while done < limit:
        chunk = os.pread(fd, min(limit - done, 1 << 24), offset + done)
        if not chunk:
            break
        parts.append(chunk)
        done += len(chunk)
    return b"".join(parts)


def check_name(file_name: str, name: str) -> None:
    """Refuse a file name no real checkpoint has: a NUL, or longer than a file system allows."""
    if "\0" in file_name:
        raise CheckpointError(f"{name}: the file name contains a NUL character; refused")
    if len(file_name.encode("utf-8", "surrogateescape")) > MAX_NAME_CHARS:
        raise CheckpointError(
            f"{name}: the file name is {len(file_name)} characters, longer than the {MAX_NAME_CHARS} a file system allows"
        )


def _open_walk(root: Path, real: Path, name: str) -> tuple[int, os.stat_result]:
    """Open `real` from `root` down, no link followed on the way; must be a regular file."""
    parts = real.relative_to(root).parts
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CheckpointError(f"{name}: cannot open its model root {root}: {exc.strerror}") from None
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = _BASE_FLAGS if last else _BASE_FLAGS | os.O_DIRECTORY
            try:
                child = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and not last):
                    raise RootEscape(
                        f"{name}: it or a folder on its path became a link after the model-root check; refused"
                    ) from None
                raise CheckpointError(f"{name}: cannot open: {exc.strerror}") from None
            os.close(fd)
            fd = child
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
            raise CheckpointError(f"{name}: is {kind}, not a regular file; refused")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def require_regular_files(folder: Path) -> None:
    """Raise CheckpointError naming the first file in `folder` that is not a regular file (links followed).

    For folders a third-party reader opens by path itself (a tokenizer's files, read by transformers or
    tokenizers): a FIFO there would block that open for ever, so it is refused before the reader runs.
    """
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as e:
        raise CheckpointError(f"{echo_name(folder)}: cannot be listed: {e.strerror or e}") from None
    for entry in entries:
        try:
            mode = os.stat(entry.path).st_mode
        except OSError as e:
            raise CheckpointError(f"{echo_name(entry.path)}: cannot be read: {e.strerror or e}") from None
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise CheckpointError(f"{echo_name(entry.path)}: is {kind}, not a regular file; a checkpoint's files must be "
                                  f"regular files")
