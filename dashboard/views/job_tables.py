"""The Job page's tables in words: final metrics, a generate's per-component load reports, events, the last sample."""

from __future__ import annotations

import pandas as pd

from dashboard import format as fmt
from dashboard import words
from dashboard.views import failure


def metrics_table(metrics: dict | None) -> pd.DataFrame:
    """The job's final scalar metrics: readable label and value with its unit (the keys are the
    JSON's: `python -m jobs show --json`, the page's tooltip says so)."""
    rows = [
        {"metric": fmt.metric_label(name), "value": fmt.metric_value(name, value)}
        for name, value in (metrics or {}).items()
        if isinstance(value, (int, float, str, type(None))) and not isinstance(value, bool)
    ]
    return pd.DataFrame(rows, columns=["metric", "value"])


LOAD_REPORT_COLUMNS = (
    ("mode", "mode"), ("device", "device"), ("tensors_placed", "tensors"), ("bytes_placed", "placed"),
    ("load_seconds", "load time"), ("throughput_gbps", "throughput"), ("footprint_ratio", "footprint"),
    ("host_peak_ratio", "host peak"), ("excluded_bytes", "not read"),
)
"""The load report fields a generate job's per-component table shows, with their headings."""


def load_reports_table(metrics: dict | None) -> pd.DataFrame:
    """One row per component a generate job loaded (metrics["loads"]: component -> LoadReport dict)."""
    loads = (metrics or {}).get("loads") or {}
    rows = []
    for component, report in loads.items():
        row = {"component": words.component(component)}
        for key, heading in LOAD_REPORT_COLUMNS:
            value = (report or {}).get(key)
            row[heading] = fmt.metric_value(key, value) if key not in ("mode", "device") else (value or fmt.MISSING)
        rows.append(row)
    return pd.DataFrame(rows, columns=["component", *(h for _, h in LOAD_REPORT_COLUMNS)])


def event_table(events: pd.DataFrame, *, last: int | None = None) -> pd.DataFrame:
    """Events as (t, what, stage, message) rows in words, newest last; `last` keeps only the final ones.
    The internal kinds and stage names stay in the JSONL download."""
    columns = ["t", "what", "stage", "message"]
    if events.empty:
        return pd.DataFrame(columns=columns)
    table = events[["t", "kind", "stage", "message"]].tail(last) if last else events[["t", "kind", "stage", "message"]]
    return pd.DataFrame({
        "t": table["t"].map(fmt.duration).tolist(),
        "what": table["kind"].map(words.event).tolist(),
        "stage": table["stage"].map(lambda v: words.stage(v) if isinstance(v, str) else "").tolist(),
        "message": table["message"].map(event_message).tolist(),
    }, columns=columns)


def event_message(message: object) -> str:
    """An event's message with stage names in words (`load.text_encoder started` -> `loading the text encoder started`)."""
    if not isinstance(message, str):
        return ""
    head, space, rest = message.partition(" ")
    return f"{words.stage(head)}{space}{rest}" if "." in head or head in words.STAGE_WORDS else failure.plain(message)


def last_sample_table(sample: dict | None, mem_total: int | None) -> pd.DataFrame:
    """The last sample as readable (field, value) rows: what a killed job looked like at the end."""
    if not sample:
        return pd.DataFrame(columns=["field", "value"])
    rows = [
        ("t", fmt.duration(sample.get("t"))),
        ("stage", words.stage(sample.get("stage")) or fmt.MISSING),
        ("tensor", sample.get("tensor_name") or fmt.MISSING),
        ("tensors placed", f"{sample.get('tensors_placed') or 0:,}"),
        ("bytes placed", fmt.gib(sample.get("bytes_placed"), 2)),
        ("VmRSS", fmt.gib(sample.get("vm_rss"), 2)),
        ("RssFile", fmt.gib(sample.get("rss_file"), 2)),
        ("RssAnon", fmt.gib(sample.get("rss_anon"), 2)),
        ("MemAvailable", fmt.gib(sample.get("mem_available"), 2)),
    ]
    if mem_total and sample.get("mem_available") is not None:
        rows.append(("System in use", fmt.gib(mem_total - sample["mem_available"], 2)))
    if sample.get("device_allocated"):
        rows.append(("GPU allocated", fmt.gib(sample["device_allocated"], 2)))
    if sample.get("cgroup_usage") is not None:
        rows.append(("cgroup usage", fmt.gib(sample["cgroup_usage"], 2)))
    return pd.DataFrame(rows, columns=["field", "value"])
