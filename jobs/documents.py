"""How the jobs CLI shows a job: the JSON document, the text view of one job, the table of many."""

from __future__ import annotations

import json
import time
from typing import Any

import sqlite_utils

from core.echo import echo_name
from core.sizes import format_size
from storage.artifacts import job_dir
from storage.config import Config
from storage.queries import artifacts, last_sample

ERROR_WIDTH = 72
"""Characters of a job's error the table shows (its first line); `show` prints it whole."""
LINE_LIMIT = 4000
"""Characters of one line `show` prints of a job's model, error or metric; a longer line, or one holding a
character that does not print (a name read from a file), is quoted by `core.echo`."""


def job_document(job: dict, db: sqlite_utils.Database, config: Config) -> dict[str, Any]:
    """The JSON shape of one job: status, error, metrics (the loader's metric names), artifacts with paths."""
    folder = job_dir(config.data_dir, job["id"])
    return {
        "id": job["id"],
        "kind": job["kind"],
        "status": job["status"],
        "error": job["error"],
        "metrics": job["metrics"],
        "spec": job["spec"],
        "stage": job["stage"],
        "progress": {"done": job["progress_done"], "total": job["progress_total"]},
        "exit_code": job["exit_code"],
        "signal": job["signal"],
        "created_at": job["created_at"],
        "started_at": job["started_at"],
        "finished_at": job["finished_at"],
        "retry_of": job["retry_of"],
        "last_sample": last_sample(db, job["id"]),
        "artifacts": [
            {"name": a["name"], "path": str(folder / a["name"]), "size": a["size"], "media_type": a["media_type"]}
            for a in artifacts(db, job["id"])
        ],
    }


def print_job(document: dict[str, Any], *, as_json: bool) -> None:
    """One job: the JSON document, or its status, times, error (whole), metrics and artifacts as text."""
    if as_json:
        print(json.dumps(document))
        return
    retried = f", retry of job {document['retry_of']}" if document["retry_of"] else ""
    print(f"job {document['id']} ({document['kind']}{retried}): {document['status']}")
    spec = document["spec"] or {}
    print(f"  model: {echo_name(spec.get('model', ''), LINE_LIMIT)}")
    if spec.get("forced"):
        refusal = (spec.get("forecast") or {}).get("refusal")
        print("  forced: queued over the forecast" + (f" ({refusal})" if refusal else ""))
    times = [(label, document[key]) for label, key in
             (("created", "created_at"), ("started", "started_at"), ("finished", "finished_at"))]
    print("  " + ", ".join(f"{label} {timestamp(value)}" for label, value in times if value))
    if document["error"]:
        print("  error: " + "\n".join(echo_name(line, LINE_LIMIT) for line in document["error"].split("\n")))
    forecast = spec.get("forecast") or {}
    if forecast.get("need") is not None:
        whole = f", the whole job peaking at {format_size(forecast['job_peak'])}" if forecast.get("job_peak") else ""
        process = (forecast.get("process") or {}).get("basis")
        print(f"  forecast: needs {format_size(forecast['need'])} of its tightest wall{whole} (process: {process})")
    for line in metric_lines(document["metrics"] or {}):
        print(f"  {line}")
    for artifact in document["artifacts"]:
        print(f"  artifact: {artifact['path']} ({artifact['media_type']}, {format_size(artifact['size'])})")
    print(f"  (the full record: python -m jobs show {document['id']} --json)")


SUMMARY_METRICS = (
    "workflow", "width", "height", "frames", "num_inference_steps", "audio", "peak_footprint", "stage_seconds",
    "mode", "device", "tensors_placed", "bytes_placed", "load_seconds", "throughput_gbps", "footprint_ratio",
    "host_peak_ratio", "memavailable_cost_ratio", "host_pinned_bytes", "excluded_tensors", "memory_guard",
)
"""The metrics `jobs show` prints, in this order (`--json` keeps every one)."""
OMITTED_AT_ZERO = ("host_pinned_bytes", "excluded_tensors")
"""Of those, the ones that say nothing at 0."""


def metric_lines(metrics: dict[str, Any]) -> list[str]:
    """The summary of a job's metrics: sizes formatted, ratios and seconds rounded, a generate's stage seconds
    summed, dicts and lists left to `--json`."""
    lines = []
    for key in SUMMARY_METRICS:
        value = metrics.get(key)
        if value is None or value == "" or isinstance(value, list) or (key in OMITTED_AT_ZERO and not value):
            continue
        if key == "stage_seconds":
            lines.append(f"seconds: {sum(value.values()):.1f} in {len(value)} stages")
        elif key == "memory_guard":
            lines.append(f"memory guard: {value.get('reason')}, grew {format_size(value.get('growth') or 0)} over "
                         f"the job's start")
        elif isinstance(value, (bool, str)):
            lines.append(f"{key}: {echo_name(str(value), LINE_LIMIT)}")
        elif key.endswith(("_bytes", "_footprint")) or key == "bytes_placed":
            lines.append(f"{key}: {format_size(int(value))}")
        elif isinstance(value, float):
            lines.append(f"{key}: {value:.3f}" if key.endswith("ratio") else f"{key}: {value:.2f}")
        else:
            lines.append(f"{key}: {value:,}")
    return lines


def print_job_table(jobs: list[dict]) -> None:
    """Jobs (`storage.queries.job_table` rows) as aligned columns under a header row, each error cut to its
    first line."""
    rows = [("ID", "KIND", "STATUS", "CREATED", "FINISHED", "MODEL", "ERROR")]
    for job in jobs:
        model = echo_name(job["model"] or "", LINE_LIMIT) + (f" [{job['component']}]" if job["component"] else "")
        rows.append((str(job["id"]), job["kind"], job["status"], timestamp(job["created_at"]),
                     timestamp(job["finished_at"]), model, echo_name(one_line(job["error"]), LINE_LIMIT)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.rjust(w) if i == 0 else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        print("  ".join(cells + [row[-1]]).rstrip())


def timestamp(seconds: float | None) -> str:
    """Local time to the second (`2026-12-01 10:02:11`), or `-` when the moment has not come."""
    return "-" if seconds is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def one_line(text: str | None, width: int = ERROR_WIDTH) -> str:
    """The first line of `text`, cut to `width` characters with `…` (multi-problem errors run to many lines)."""
    if not text:
        return ""
    first = text.strip().splitlines()[0]
    if len(first) > width:
        return first[: width - 1].rstrip() + "…"
    return first + (" …" if "\n" in text.strip() else "")
