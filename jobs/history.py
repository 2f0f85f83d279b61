"""This machine's past jobs as the forecasts learn from them: stage timings for `models.forecast.eta`, the job's own
process for `models.forecast.process_size`.

A finished generate job contributes a record per stage it timed when its spec
carries the forecast made at submit (`spec.forecast`: each stage's work and the
device it ran on) and its metrics carry `stage_seconds`; each record carries the
job's lever set (`models.speed.levers.lever_key`), which the ETA of a lever stage matches, and its LoRA set
(`models.lora.inputs.lora_key`), which the ETA of a load its LoRAs change matches. Any job that reached
its first weight (a generate's first `load.*` stage, a load's `load` stage) with a forecast on its spec
contributes its process: its first sample and that stage's first sample.
"""

from __future__ import annotations

import sqlite_utils

from models.forecast.eta import StageRecord
from models.speed.levers import lever_key
from models.lora.inputs import lora_key
from models.forecast.process_size import ProcessRecord
from storage.queries import first_stage_sample, list_jobs, samples_since

HISTORY_JOBS = 200
"""Most recent succeeded generate jobs read."""
PROCESS_JOBS = 20
"""Most recent jobs of a kind whose process is read (two samples each)."""


def stage_records(db: sqlite_utils.Database, *, limit: int = HISTORY_JOBS) -> list[StageRecord]:
    """Every timed stage of the last `limit` succeeded generate jobs that recorded their forecast."""
    records = []
    for job in list_jobs(db, status="succeeded", kind="generate", limit=limit):
        forecast = (job.get("spec") or {}).get("forecast") or {}
        seconds = (job.get("metrics") or {}).get("stage_seconds") or {}
        work, device = forecast.get("work") or {}, forecast.get("device")
        if not device:
            continue
        generate = (job.get("spec") or {}).get("generate") or {}
        levers, loras = lever_key(generate), lora_key(generate)
        for stage, amount in work.items():
            if isinstance(seconds.get(stage), (int, float)):
                records.append(StageRecord(stage, float(seconds[stage]), float(amount), device, levers, loras))
    return records


def process_records(db: sqlite_utils.Database, kind: str, *, limit: int = PROCESS_JOBS) -> list[ProcessRecord]:
    """The process of each of the last `limit` finished `kind` jobs that reached their first weight (a job the
    guard stopped later counts: its start-up was over) and recorded the device of their forecast."""
    records = []
    for job in list_jobs(db, status=("succeeded", "failed", "killed"), kind=kind, limit=limit):
        device = ((job.get("spec") or {}).get("forecast") or {}).get("device")
        first = samples_since(db, job["id"], limit=1)
        ready = first_stage_sample(db, job["id"], "load") if device and first else None
        if ready is None or ready["seq"] == first[0]["seq"]:
            continue
        records.append(ProcessRecord(kind, device, int(ready["vm_rss"]), start_up(first[0], ready)))
    return records


def start_up(first: dict, ready: dict) -> int:
    """How far system in use grew between two samples of one job, as far as the job can have grown it: at least
    the anonymous memory it added, at most all the anonymous memory it holds (every page it shares with the
    fork server copied). MemAvailable is the machine's: other processes move it too."""
    grown = int(first["mem_available"]) - int(ready["mem_available"])
    return min(max(grown, int(ready["rss_anon"]) - int(first["rss_anon"])), int(ready["rss_anon"]))
