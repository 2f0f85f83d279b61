"""A Hugging Face cache laid out as `hf download` leaves it, built from any local model folder.

`<hub>/models--<org>--<name>/blobs/<sha256>` holds each file's bytes once; `snapshots/<revision>/<path>` is
a relative link to `../../blobs/<sha256>` (one `..` more per folder level); `refs/main` holds the revision.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

REVISION = "0123456789abcdef0123456789abcdef01234567"


def hub_snapshot(source: Path, hub: Path, repo_id: str = "MiniMaxAI/MiniMax-H3", revision: str = REVISION,
                 ref: str | None = "main") -> Path:
    """Copy `source` (a folder or one file) into `hub` in the cache's layout; the snapshot folder."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    for path in files:
        relative = Path(path.name) if source.is_file() else path.relative_to(source)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        blob = repo / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(path, blob)
        link = snapshot / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref is not None:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(revision)
    return snapshot
