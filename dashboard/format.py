"""Every number the dashboard shows goes through here, so units never drift.

Memory reads in binary units by size: GiB (2**30 bytes) from 1 GiB up, MiB
below (a 65 MiB checkpoint never reads "0.06 GiB"), KiB under 1 MiB. Throughput
is decimal GB/s everywhere, because the load report's `throughput_gbps` is
defined as bytes read / seconds / 1e9 (`loader.report.LoadReport`). Ratios read "1.16×",
fractions "64%", durations carry their unit. Missing values read "—" rather
than 0, which would be a lie.
"""

from __future__ import annotations

import math

GIB = 2**30
"""Bytes in one GiB."""
MIB = 2**20
"""Bytes in one MiB."""

MISSING = "—"
"""What a value that does not exist (yet) reads as."""


def _absent(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def gib(nbytes: float | None, digits: int = 1) -> str:
    """A memory size in the unit its size needs: `63.2 GiB`; under 1 GiB `752 MiB`, under 1 MiB
    `12 KiB` and under 1 KiB `14 B` (nothing is `0 B`, never "0.0 GiB"), with one decimal fewer than GiB
    (MiB are 1024 times finer)."""
    if _absent(nbytes):
        return MISSING
    magnitude = abs(nbytes)
    if magnitude >= GIB:
        return f"{nbytes / GIB:.{digits}f} GiB"
    fine = max(0, digits - 1)
    if magnitude >= MIB:
        return f"{nbytes / MIB:.{fine}f} MiB"
    if magnitude >= 2**10:
        return f"{nbytes / 2**10:.{fine}f} KiB"
    return f"{int(nbytes)} B"


def size_unit(nbytes: float | None) -> tuple[str, int]:
    """("MiB", 2**20) for sizes under 1 GiB, else ("GiB", 2**30): the unit an axis
    reads in, so a 65 MiB checkpoint's axis says 0..65 rather than 0.00004."""
    if not _absent(nbytes) and 0 < abs(nbytes) < GIB:
        return "MiB", MIB
    return "GiB", GIB


def ratio(value: float | None, digits: int = 2) -> str:
    """`1.16×` for a footprint or cost ratio."""
    if _absent(value):
        return MISSING
    return f"{value:.{digits}f}×"


def percent(fraction: float | None, digits: int = 0) -> str:
    """`64%` from a fraction in [0, 1]."""
    if _absent(fraction):
        return MISSING
    return f"{fraction * 100:.{digits}f}%"


def duration(seconds: float | None) -> str:
    """`0.84 s`, `41.2 s`, `6 min 52 s` or `1 h 03 min`: as precise as a human reads it."""
    if _absent(seconds):
        return MISSING
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def rate_gbps(value: float | None) -> str:
    """`4.93 GB/s` from a value already in GB/s (decimal, as `throughput_gbps` is defined)."""
    if _absent(value):
        return MISSING
    return f"{value:.2f} GB/s" if value < 10 else f"{value:.1f} GB/s"


def rate(bytes_per_second: float | None) -> str:
    """`4.93 GB/s` from bytes per second: the same decimal unit as `throughput_gbps`."""
    if _absent(bytes_per_second):
        return MISSING
    return rate_gbps(bytes_per_second / 1e9)


def delta_ratio(value: float | None, reference: float | None, digits: int = 2) -> str | None:
    """`+0.16×` for a change of a ratio, None when either is missing or they are equal at
    the shown precision (a "+0.00×" would read as a change)."""
    if _absent(value) or _absent(reference):
        return None
    change = round(value - reference, digits)
    if change == 0:
        return None
    return f"{change:+.{digits}f}×"


def flag(value: object) -> str:
    """`on` / `off` for a boolean setting, `default` for None (the policy decides)."""
    if value is None:
        return "default"
    return "on" if value else "off"


METRIC_LABELS: dict[str, str] = {
    "bytes_placed": "Bytes placed",
    "footprint_ratio": "Footprint ratio",
    "host_peak_ratio": "Host peak ratio",
    "memavailable_cost_ratio": "MemAvailable cost ratio",
    "load_seconds": "Load time",
    "throughput_gbps": "Throughput",
    "raw_read_gbps": "Raw read rate",
    "read_efficiency": "Read efficiency",
    "steps_computed": "Transformer passes computed",
    "steps_reused": "Transformer passes reused (step cache)",
}
"""Readable names for metric names the name alone says badly (the load report's, `loader.report.LoadReport`, and a
generate's step counts); others are derived from the name."""


def metric_label(name: str) -> str:
    """A readable label for a metric name (`peak_vm_rss_bytes` -> `Peak vm rss`)."""
    if name in METRIC_LABELS:
        return METRIC_LABELS[name]
    words = name
    for suffix in ("_bytes", "_seconds", "_gbps"):
        if words.endswith(suffix):
            words = words[: -len(suffix)]
    words = words.replace("_", " ").strip()
    return words[:1].upper() + words[1:]


BYTE_METRICS = frozenset({"memory_limit", "memory_budget", "memory_floor", "peak_footprint"})
"""Metrics in bytes whose name does not say so."""


def metric_value(name: str, value: object) -> str:
    """Format one metric by what its name says it measures."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return MISSING if value is None else str(value)
    if _absent(float(value)):
        return MISSING
    if name.endswith("_ratio"):
        return ratio(value)
    if name.endswith("_efficiency") or name.endswith("_fraction"):
        return percent(value)
    if name.endswith("_gbps"):
        return rate_gbps(value)
    if name.endswith("_seconds") or name.endswith("_s"):
        return duration(value)
    if "bytes" in name or name in BYTE_METRICS:
        return gib(value, 2)
    if isinstance(value, float):
        return f"{value:.3g}"
    return f"{value:,}"
