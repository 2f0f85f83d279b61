"""Read queries the dashboard and the CLI need. Plain functions, database first."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import sqlite_utils

from storage import jobs_table
from storage.artifacts import job_dir
from storage.connections import transaction
from storage.schema import EXTREMES_BLOCK, FINAL_STATUSES, SAMPLE_COLUMNS

SERIES_COLUMNS = ("vm_rss", "rss_anon", "rss_file", "device_allocated", "mem_available", "cgroup_usage")
"""Memory columns a downsampled series keeps the peaks (and troughs) of, by default."""

_SIZE_COLUMNS = frozenset(SAMPLE_COLUMNS[8:])


def _job_row(row: dict) -> dict:
    row = dict(row)
    row["spec"] = json.loads(row["spec"]) if row.get("spec") else None
    row["metrics"] = json.loads(row["metrics"]) if row.get("metrics") else None
    row["cancel_requested"] = bool(row.get("cancel_requested"))
    return row


def _job_filter(status: str | Iterable[str] | None = None, kind: str | Iterable[str] | None = None,
                search: str | None = None, modes: Iterable[str] | None = None,
                about: str | None = None) -> tuple[str, list]:
    """The WHERE clause (empty or starting with " WHERE") and its arguments for list_jobs and count_jobs."""
    where, args = [], []
    for column, wanted in (("status", status), ("kind", kind), ("json_extract(spec, '$.mode')", modes)):
        if wanted is not None:
            values = [wanted] if isinstance(wanted, str) else list(wanted)
            where.append(f"{column} IN ({', '.join('?' * len(values))})" if values else "0")
            args += values
    if search:
        where.append("instr(lower(spec), lower(?)) > 0")
        args.append(search)
    if about:
        where.append("instr(lower(coalesce(json_extract(spec, '$.model'), '') || char(10) || "
                     "coalesce(json_extract(spec, '$.component'), '') || char(10) || "
                     "coalesce(json_extract(spec, '$.generate.prompt'), '')), lower(?)) > 0")
        args.append(about)
    return (" WHERE " + " AND ".join(where) if where else ""), args


def list_jobs(
    db: sqlite_utils.Database,
    *,
    status: str | Iterable[str] | None = None,
    kind: str | Iterable[str] | None = None,
    search: str | None = None,
    modes: Iterable[str] | None = None,
    about: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[dict]:
    """Jobs, newest first, with `spec` and `metrics` decoded.

    `status` and `kind` are one value or several, `modes` placement modes; `search` matches a substring of the
    spec JSON (model path, prompt, mode); `about` a substring of the checkpoint path, component or prompt alone.
    """
    where, args = _job_filter(status, kind, search, modes, about)
    sql = "SELECT * FROM jobs" + where + " ORDER BY id DESC LIMIT ? OFFSET ?"
    return [_job_row(r) for r in db.query(sql, args + [limit, offset])]


JOB_TABLE_COLUMNS = ("id", "kind", "status", "created_at", "finished_at", "model", "component", "error")
"""What a table of jobs shows (`python -m jobs list`): the model and component out of the spec, never the
whole spec or the metrics, whose JSON can run to megabytes a job."""
ERROR_HEAD = 4096
"""Characters of a job's error a table row carries (it shows the first line, cut to fit)."""


def job_table(db: sqlite_utils.Database, *, status: str | Iterable[str] | None = None, kind: str | None = None,
              limit: int = 100) -> list[dict]:
    """Jobs, newest first, as a table shows them (`JOB_TABLE_COLUMNS`): its memory grows with the rows
    shown, not with what each job stored."""
    where, args = _job_filter(status, kind)
    sql = (f"SELECT id, kind, status, created_at, finished_at, json_extract(spec, '$.model') AS model, "
           f"json_extract(spec, '$.component') AS component, substr(error, 1, {ERROR_HEAD}) AS error "
           f"FROM jobs{where} ORDER BY id DESC LIMIT ?")
    return list(db.query(sql, args + [limit]))


def count_jobs(
    db: sqlite_utils.Database,
    *,
    kind: str | Iterable[str] | None = None,
    modes: Iterable[str] | None = None,
    about: str | None = None,
) -> dict[str, int]:
    """Status -> how many jobs (over the whole table, filtered as list_jobs is): what a page of jobs is out of."""
    where, args = _job_filter(None, kind, None, modes, about)
    return {status: n for status, n in db.execute(f"SELECT status, count(*) FROM jobs{where} GROUP BY status", args)}


def job_choices(db: sqlite_utils.Database) -> tuple[list[str], list[str]]:
    """(kinds, modes) that occur among all jobs, sorted: what History's pickers offer."""
    kinds = [k for (k,) in db.execute("SELECT DISTINCT kind FROM jobs ORDER BY kind")]
    modes = [m for (m,) in db.execute("SELECT DISTINCT json_extract(spec, '$.mode') AS m FROM jobs "
                                       "WHERE m IS NOT NULL ORDER BY m")]
    return kinds, modes


def get_job(db: sqlite_utils.Database, job_id: int) -> dict | None:
    """One job with `spec` and `metrics` decoded, or None."""
    rows = list(db.query("SELECT * FROM jobs WHERE id = ?", [job_id]))
    return _job_row(rows[0]) if rows else None


def sample_count(db: sqlite_utils.Database, job_id: int) -> int:
    return db.execute("SELECT count(*) FROM samples WHERE job_id = ?", [job_id]).fetchone()[0]


def last_sample(db: sqlite_utils.Database, job_id: int) -> dict | None:
    """The most recent sample of a job (any rank), or None."""
    rows = list(db.query("SELECT * FROM samples WHERE job_id = ? ORDER BY t DESC, seq DESC LIMIT 1", [job_id]))
    return rows[0] if rows else None


def samples_since(
    db: sqlite_utils.Database, job_id: int, since_seq: int = -1, *, rank: int = 0, limit: int = 10_000
) -> list[dict]:
    """Samples of one rank with seq > `since_seq`, in order: a job's first samples (the dashboard's
    baseline), or what a live view appends to what it has."""
    return list(
        db.query(
            "SELECT * FROM samples WHERE job_id = ? AND rank = ? AND seq > ? ORDER BY seq LIMIT ?",
            [job_id, rank, since_seq, limit],
        )
    )


def first_stage_sample(db: sqlite_utils.Database, job_id: int, stage_prefix: str) -> dict | None:
    """Rank 0's first sample in a stage whose name starts with `stage_prefix` (`load`: a job's first weight),
    or None."""
    rows = list(db.query("SELECT * FROM samples WHERE job_id = ? AND rank = 0 AND substr(stage, 1, ?) = ? "
                         "ORDER BY seq LIMIT 1", [job_id, len(stage_prefix), stage_prefix]))
    return rows[0] if rows else None


def sample_series(
    db: sqlite_utils.Database,
    job_id: int,
    *,
    max_points: int = 2000,
    columns: Sequence[str] = SERIES_COLUMNS,
) -> list[dict]:
    """One job's samples (every rank), downsampled to at most `max_points` rows that keep the peaks.

    Each rank's samples are cut into equal seq buckets; from each bucket the
    rows holding the minimum and the maximum of every column in `columns` are
    kept (real rows, not averages), plus each rank's first and last sample.
    So the global peak of every column is always there, and a short spike is
    never smoothed away. A long series is bucketed from the per-block extremes
    the sample writer keeps (`sample_extremes`, blocks of `EXTREMES_BLOCK`
    samples), so the cost grows with blocks, not samples; a short one from the
    samples themselves.
    """
    unknown = [c for c in columns if c not in _SIZE_COLUMNS]
    if unknown:
        raise ValueError(f"unknown sample columns {unknown}; known: {sorted(_SIZE_COLUMNS)}")
    ranks = _rank_spans(db, job_id)
    total = sum(hi - lo + 1 for _, lo, hi in ranks)
    if total <= max_points:
        return list(db.query("SELECT * FROM samples WHERE job_id = ? ORDER BY rank, seq", [job_id]))
    rows: list[dict] = []
    for rank, lo, hi in ranks:
        budget = max(1, max_points * (hi - lo + 1) // total)
        # Each bucket keeps at most 2 rows per column, and the first and last rows are
        # added: size the buckets so the worst case still fits the budget.
        buckets = max(1, (budget - 2) // (2 * max(1, len(columns))))
        blocks = hi // EXTREMES_BLOCK - lo // EXTREMES_BLOCK + 1
        pick = _pick_from_blocks if blocks >= buckets else _pick_from_samples
        seqs = pick(db, job_id, rank, lo, hi, buckets, columns) | {lo, hi}
        rows += db.query(
            "SELECT * FROM samples WHERE job_id = ? AND rank = ? AND seq IN (SELECT value FROM json_each(?)) "
            "ORDER BY seq",
            [job_id, rank, json.dumps(sorted(seqs))],
        )
    return rows


def _rank_spans(db: sqlite_utils.Database, job_id: int) -> list[tuple[int, int, int]]:
    """(rank, first seq, last seq) of each rank of a job, from a few index seeks rather than a scan.

    A rank's seqs are contiguous (a SampleWriter continues the sequence), so the
    span is also its sample count.
    """
    ranks = [r[0] for r in db.execute(
        "WITH RECURSIVE r(rank) AS (SELECT min(rank) FROM samples WHERE job_id = ?1 UNION ALL "
        "SELECT (SELECT min(rank) FROM samples WHERE job_id = ?1 AND rank > r.rank) FROM r WHERE r.rank IS NOT NULL) "
        "SELECT rank FROM r WHERE rank IS NOT NULL",
        [job_id],
    )]
    spans = []
    for rank in ranks:
        # A lone min() or max() over the primary key is one seek; both in one SELECT would scan.
        lo = db.execute("SELECT min(seq) FROM samples WHERE job_id = ? AND rank = ?", [job_id, rank]).fetchone()[0]
        hi = db.execute("SELECT max(seq) FROM samples WHERE job_id = ? AND rank = ?", [job_id, rank]).fetchone()[0]
        spans.append((rank, lo, hi))
    return spans


def _pick_from_blocks(
    db: sqlite_utils.Database, job_id: int, rank: int, lo: int, hi: int, buckets: int, columns: Sequence[str]
) -> set[int]:
    """Seqs of the extreme rows per bucket of whole blocks, read from `sample_extremes`."""
    first = lo // EXTREMES_BLOCK
    span = hi // EXTREMES_BLOCK - first + 1
    seqs: set[int] = set()
    for column in columns:
        for value, seq, agg in (("lo", "lo_seq", "min"), ("hi", "hi_seq", "max")):
            # SQLite returns the other columns of the row holding a lone min()/max().
            seqs.update(
                r[0] for r in db.execute(
                    f"SELECT {seq}, {agg}({value}) FROM sample_extremes WHERE job_id = ? AND rank = ? AND col = ? "
                    f"GROUP BY (block - ?) * ? / ?",
                    [job_id, rank, column, first, buckets, span],
                )
            )
    return seqs


def _pick_from_samples(
    db: sqlite_utils.Database, job_id: int, rank: int, lo: int, hi: int, buckets: int, columns: Sequence[str]
) -> set[int]:
    """Seqs of the extreme rows per bucket of samples: one grouped scan per column and end."""
    span = hi - lo + 1
    seqs: set[int] = set()
    for column in columns:
        for agg in ("min", "max"):
            seqs.update(
                r[0] for r in db.execute(
                    f"SELECT seq, {agg}({column}) FROM samples WHERE job_id = ? AND rank = ? "
                    f"AND {column} IS NOT NULL GROUP BY (seq - ?) * ? / ?",
                    [job_id, rank, lo, buckets, span],
                )
            )
    return seqs


def samples_csv(db: sqlite_utils.Database, job_id: int, *, chunk: int = 5000) -> Iterator[str]:
    """Every sample of a job as CSV text, header first, a chunk of lines at a time (for downloads)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(SAMPLE_COLUMNS)
    cursor = db.execute(
        f"SELECT {', '.join(SAMPLE_COLUMNS)} FROM samples WHERE job_id = ? ORDER BY rank, seq", [job_id]
    )
    while True:
        batch = cursor.fetchmany(chunk)
        if not batch:
            break
        writer.writerows(batch)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    if buffer.tell():
        yield buffer.getvalue()


def events(db: sqlite_utils.Database, job_id: int, *, since_id: int = 0) -> list[dict]:
    """A job's events in order (stage start/end, policy decisions, warnings), `data` decoded."""
    rows = list(db.query("SELECT * FROM events WHERE job_id = ? AND id > ? ORDER BY id", [job_id, since_id]))
    for row in rows:
        row["data"] = json.loads(row["data"]) if row["data"] else None
    return rows


def artifacts(db: sqlite_utils.Database, job_id: int) -> list[dict]:
    """Files a job produced (name, size, media type); resolve them with `storage.artifacts.resolve_artifact`."""
    return list(db.query("SELECT * FROM artifacts WHERE job_id = ? ORDER BY id", [job_id]))


def supervisors(db: sqlite_utils.Database) -> list[dict]:
    """Supervisor heartbeat rows, most recent first (see `jobs.presence.supervisor_status`)."""
    return list(db.query("SELECT * FROM supervisors ORDER BY heartbeat_at DESC"))


def delete_job(db: sqlite_utils.Database, data_dir: str | Path, job_id: int) -> int:
    """Delete a finished job: its row, samples, sample extremes, events, artifact rows and its
    artifact folder. Returns the bytes of files removed. A queued or running job is refused
    (ValueError naming its status), checked in the same write transaction as the delete, so a
    supervisor cannot claim it in between; retries of the job keep their rows but lose the link."""
    folder = job_dir(data_dir, job_id)
    with transaction(db) as conn:
        row = conn.execute("SELECT status FROM jobs WHERE id = ?", [job_id]).fetchone()
        if row is None:
            raise ValueError(f"there is no job {job_id}")
        if row[0] not in FINAL_STATUSES:
            raise ValueError(f"job {job_id} is {row[0]}: only a finished job can be deleted (cancel it first)")
        for table in ("samples", "sample_extremes", "events", "artifacts"):
            conn.execute(f"DELETE FROM {table} WHERE job_id = ?", [job_id])
        jobs_table.delete(conn, job_id)
    reclaimed = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0
    shutil.rmtree(folder, ignore_errors=True)
    return reclaimed
