"""The process-wide settings a Drainboard process makes where it starts, never inside a library call.

Each entry point calls `configure_process` first (the CLIs' mains, the job child, the fork server, the
sharded worker, `app.py`); a library user who imports `models` or `loader` keeps their own settings:

- `HF_HUB_OFFLINE=1`: diffusers and transformers read every file from local folders and never contact a
  model hub. huggingface_hub reads it when it is imported, so it is set before anything imports it.
- glibc's mmap threshold, fixed (`machine.host_heap`): freed host buffers of 1 MiB and up leave the
  resident set at once, so the same job's stage peaks do not move with the order of earlier frees.
- on a CUDA device, torch's pinned allocator switched to threaded host registration
  (`loader.io.host_blocks.prefer_host_registration`): the switch is only safe while torch holds no pinned
  block, which a process's start guarantees.
"""

from __future__ import annotations

import os

from machine.host_heap import return_large_frees_to_os


def configure_process(device: str | None = None) -> None:
    """Make this process's settings; `device` (when known) adds a CUDA device's. Idempotent: an entry point
    calls it first, and again with the device once it knows it."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    return_large_frees_to_os()
    if device is not None and device.split(":", 1)[0] == "cuda":
        from .io.host_blocks import prefer_host_registration

        prefer_host_registration()
