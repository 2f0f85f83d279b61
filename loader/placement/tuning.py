"""`stream`'s options: the product's checked one by one (`threads`, `direct_io`, `drop_page_cache`, `reserve`),
and those that exist only for comparison in one frozen `StreamTuning`."""

from __future__ import annotations

from dataclasses import dataclass, fields

from core.errors import PlacementError

_MiB = 1024 * 1024


@dataclass(frozen=True)
class StreamTuning:
    """`stream`'s options that exist to compare its parts on a benchmark, kept out of the product's own
    (as vLLM keeps a load's options in one LoadConfig): every default is what the product runs."""

    read_bytes: int | None = None
    """Bytes per positioned read: None for DIRECT_READ_BYTES on CPU targets, RING_READ_BYTES in the CUDA ring."""
    staging_bytes: int | None = None
    """Bytes per staging buffer: None for RING_CHUNK_BYTES in the CUDA ring, STAGING_BYTES to convert."""
    staging_buffers: int | None = None
    """Ring buffer count (None: sized by `ring_geometry`); converting staging buffers (None: 4)."""
    readahead_bytes: int = 64 * _MiB
    """POSIX_FADV_WILLNEED window ahead of the converting staging's reads."""
    copy_streams: int = 1
    """Streams the ring's copies are spread over."""
    pin: bool = True
    """Page-locked staging (False: pageable buffers)."""
    ranges: bool = True
    """False sends CUDA same-dtype tensors through per-tensor staging instead of the ring."""
    io_uring: bool | None = None
    """The CUDA ring's reader: None io_uring where the kernel allows it (and on x86), else threads;
    True io_uring or an error; False threads."""
    driver_copies: bool = True
    """The CUDA ring queues its copies through the CUDA driver where it can (False: through torch)."""

    @classmethod
    def from_options(cls, options: dict) -> "StreamTuning":
        """From keyword options, each checked (a bad one is a PlacementError naming it); missing ones default."""
        values = {}
        for f in fields(cls):
            if f.name not in options:
                continue
            if f.type.startswith("bool"):
                values[f.name] = flag_option(options, f.name, f.default)
            else:
                values[f.name] = positive_option(options, f.name, f.default, minimum=0 if f.name == "readahead_bytes" else 1)
        return cls(**values)


TUNING_OPTIONS = tuple(f.name for f in fields(StreamTuning))


def positive_option(options: dict, key: str, default: int | None, *, minimum: int = 1) -> int | None:
    value = options.get(key, default)
    if value is None and default is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise PlacementError(f"placement mode 'stream' option {key} must be {kind}, got {value!r}")
    return value


def flag_option(options: dict, key: str, default: bool | None) -> bool | None:
    value = options.get(key, default)
    if value is not None and not isinstance(value, bool):
        raise PlacementError(f"placement mode 'stream' option {key} must be true or false, got {value!r}")
    return value
