"""How many pinned buffers of what size the CUDA ring gets: a share of the bytes it carries, bounded, and on
unified memory a share of the pool; enough buffers to keep every reader busy, more when reading the disk."""

from __future__ import annotations

from dataclasses import dataclass

from machine.device import DeviceInfo
from .chunks import ALIGN

_MiB = 1024 * 1024

STAGING_SHARE = 64
"""The ring's buffers together hold at most 1/STAGING_SHARE of the bytes they carry (footprint <= 1.016)."""
STAGING_MAX = 1024 * _MiB
"""...and never more than this."""
UNIFIED_POOL_SHARE = 256
"""On unified memory the pinned ring also stays under 1/UNIFIED_POOL_SHARE of the pool's available bytes:
it comes out of the memory the model itself is loaded into."""
MIN_BUFFERS = 3
"""Fewest ring buffers: two reading while one is copied out."""
SPARE_BUFFERS = 4
"""Ring buffers beyond those whose reads keep every reader busy: copies queued on the device while the
next reads run. More staging made the copies slower (see RING_CHUNK_BYTES and docs/benchmarks.md, Ring
settings on one H200)."""
RING_READ_BYTES = 4 * _MiB
"""The ring's positioned read size: small reads read the page cache faster than large ones; see
docs/benchmarks.md, Ring settings on one H200."""
RING_CHUNK_BYTES = 16 * _MiB
"""The ring's buffer size: the host-to-device copies ran faster the less staging the ring cycled
through; see docs/benchmarks.md, Ring settings on one H200."""


@dataclass(frozen=True)
class RingGeometry:
    """How many ring buffers of what size a load gets, and why."""

    buffers: int
    """Buffer count."""
    chunk_bytes: int
    """Bytes per buffer (a multiple of the O_DIRECT alignment)."""
    read_bytes: int
    """Bytes per positioned read: a buffer is filled by chunk_bytes / read_bytes reads in parallel."""
    budget: int
    """The staging budget the geometry was fitted into."""
    unified: bool
    """Whether the pool was shared with the host (the budget then also follows the pool)."""
    disk: bool = False
    """Whether the ring reads from the disk (O_DIRECT), and so holds every buffer the budget allows."""


def ring_geometry(
    total_bytes: int,
    info: DeviceInfo,
    *,
    threads: int,
    chunk_bytes: int,
    buffers: int | None,
    available: int,
    read_bytes: int = RING_READ_BYTES,
    disk: bool = False,
) -> RingGeometry:
    """The ring for `total_bytes` of same-dtype tensors on device `info`; `disk` when its reads go to
    the disk rather than the page cache.

    Budget: 1/STAGING_SHARE of the bytes, at most STAGING_MAX, and on unified
    memory at most 1/UNIFIED_POOL_SHARE of the pool (the smaller of the
    device's memory and the host's MemAvailable). `buffers` (the
    staging_buffers option) fixes the count; otherwise enough buffers being
    read to give every reader thread a `read_bytes` read, plus SPARE_BUFFERS,
    as many as the budget holds, at least MIN_BUFFERS (pinning costs time,
    so no more are allocated than the readers can fill). Reading from the
    disk, the count is as many as the budget holds: the disk's rate grows with
    the bytes in flight, and beside a read of several seconds per GiB,
    pinning 600 MiB on the helper costs nothing (see docs/benchmarks.md,
    Ring settings on one H200). Buffers shrink (down to 4 MiB) before the
    count goes under MIN_BUFFERS, and never exceed what the model needs.
    """
    budget = min(total_bytes // STAGING_SHARE, STAGING_MAX)
    pools = [x for x in (info.total_memory, available) if x]
    if info.unified_memory and pools:
        budget = min(budget, min(pools) // UNIFIED_POOL_SHARE)
    chunk = max(ALIGN, chunk_bytes - chunk_bytes % ALIGN)
    read = max(ALIGN, min(read_bytes - read_bytes % ALIGN, chunk))
    if buffers is None:
        reading = -(-threads * read // chunk)
        count = max(MIN_BUFFERS, budget // chunk if disk else min(reading + SPARE_BUFFERS, budget // chunk))
        if count * chunk > budget:  # a power of two: what the pinned allocator hands out anyway
            chunk = max(4 * _MiB, 1 << max(12, (budget // count).bit_length() - 1))
    else:
        count = max(2, buffers)
    chunk = min(chunk, -(-max(total_bytes, 1) // ALIGN) * ALIGN)
    return RingGeometry(count, chunk, min(read, chunk), budget, info.unified_memory, disk)
