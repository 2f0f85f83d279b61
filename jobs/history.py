"""This machine's stage timings, read from the job history for `models.eta`.

A finished generate job contributes a record per stage it timed when its spec
carries the forecast made at submit (`spec.forecast`: each stage's work and the
device it ran on) and its metrics carry `stage_seconds`; each record carries the
job's lever set (`models.levers.lever_key`), which the ETA of a lever stage matches.
"""

from __future__ import annotations

import sqlite_utils

from models.eta import StageRecord
from models.levers import lever_key
from storage.queries import list_jobs

HISTORY_JOBS = 200
"""Most recent succeeded generate jobs read."""


def stage_records(db: sqlite_utils.Database, *, limit: int = HISTORY_JOBS) -> list[StageRecord]:
    """Every timed stage of the last `limit` succeeded generate jobs that recorded their forecast."""
    records = []
    for job in list_jobs(db, status="succeeded", kind="generate", limit=limit):
        forecast = (job.get("spec") or {}).get("forecast") or {}
        seconds = (job.get("metrics") or {}).get("stage_seconds") or {}
        work, device = forecast.get("work") or {}, forecast.get("device")
        if not device:
            continue
        levers = lever_key((job.get("spec") or {}).get("generate") or {})
        for stage, amount in work.items():
            if isinstance(seconds.get(stage), (int, float)):
                records.append(StageRecord(stage, float(seconds[stage]), float(amount), device, levers))
    return records
