"""Cached reads for the pages: everything the dashboard shows comes through here.

Loaders take the database path (a string), never a connection: a SQLite
connection belongs to the thread that opened it, and Streamlit serves each
session from its own thread. Each call opens a short-lived connection.
Live data is keyed by the job's sample count, so a finished job's series is
built once and a running job's only when new samples arrived.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from machine.device import DeviceInfo, probe_device
from storage import queries
from storage.artifacts import resolve_artifact
from storage.config import Config, load_config
from storage.connections import connect
from storage.schema import SAMPLE_COLUMNS

MAX_POINTS = 1500
"""Rows a chart receives at most; storage keeps each bucket's min and max, so peaks survive."""

CHART_COLUMNS = ("vm_rss", "rss_file", "device_allocated", "mem_available", "cgroup_usage")
"""Columns whose peaks and troughs the downsampling keeps (the charted series)."""


@st.cache_data(ttl=30, show_spinner=False)
def config() -> Config:
    """The effective configuration (environment over drainboard.toml)."""
    return load_config()


def db_path() -> str:
    return str(config().db_path)


def _db(path: str):
    return connect(path)


@st.cache_data(ttl=1, show_spinner=False)
def jobs(path: str, *, status: tuple[str, ...] | None = None, limit: int = 500) -> list[dict]:
    """Jobs newest first (spec and metrics decoded)."""
    return queries.list_jobs(_db(path), status=status, limit=limit)


@st.cache_data(ttl=1, show_spinner=False)
def job_page(path: str, *, status: tuple[str, ...] | None, kinds: tuple[str, ...] | None,
             modes: tuple[str, ...] | None, about: str, limit: int, offset: int) -> list[dict]:
    """One page of jobs newest first, filtered in the database (History pages through every job this way)."""
    return queries.list_jobs(_db(path), status=status, kind=kinds, modes=modes, about=about or None, limit=limit,
                             offset=offset)


@st.cache_data(ttl=1, show_spinner=False)
def job_counts(path: str, *, kinds: tuple[str, ...] | None = None, modes: tuple[str, ...] | None = None,
               about: str = "") -> dict[str, int]:
    """Status -> jobs over the whole table (filtered by kind, mode and text)."""
    return queries.count_jobs(_db(path), kind=kinds, modes=modes, about=about or None)


@st.cache_data(ttl=5, show_spinner=False)
def job_choices(path: str) -> tuple[list[str], list[str]]:
    """(kinds, modes) among all jobs."""
    return queries.job_choices(_db(path))


def active_jobs(path: str) -> list[dict]:
    """Running jobs (oldest first), then queued ones in the order a worker takes them (storage's QUEUE_ORDER):
    the one list the header chip and the Run page's queue both draw, so one cannot say "Idle" while the other
    lists a running job."""
    return sorted(jobs(path, status=("running", "queued"), limit=10_000),
                  key=lambda j: (j["status"] != "running", j.get("queue_rank") or j["id"], j["id"]))


@st.cache_data(ttl=1, show_spinner=False)
def job(path: str, job_id: int) -> dict | None:
    """One job row, or None."""
    return queries.get_job(_db(path), job_id)


@st.cache_data(ttl=1, show_spinner=False)
def sample_count(path: str, job_id: int) -> int:
    return queries.sample_count(_db(path), job_id)


@st.cache_data(max_entries=64, show_spinner=False)
def series(path: str, job_id: int, count: int, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """A job's samples downsampled to at most `max_points` rows keeping peaks.

    `count` (the job's current sample count) is only part of the cache key:
    new samples make a new entry, a finished job's frame is built once.
    """
    rows = queries.sample_series(_db(path), job_id, max_points=max_points, columns=CHART_COLUMNS)
    frame = pd.DataFrame(rows, columns=list(SAMPLE_COLUMNS))
    return frame.sort_values(["rank", "t", "seq"], kind="stable").reset_index(drop=True)


@st.cache_data(ttl=1, show_spinner=False)
def last_sample(path: str, job_id: int) -> dict | None:
    return queries.last_sample(_db(path), job_id)


@st.cache_data(ttl=1, show_spinner=False)
def events(path: str, job_id: int) -> pd.DataFrame:
    """A job's events (t, kind, stage, message, data) in order."""
    rows = queries.events(_db(path), job_id)
    return pd.DataFrame(rows, columns=["id", "job_id", "t", "created_at", "kind", "stage", "message", "data"])


@st.cache_data(ttl=2, show_spinner=False)
def artifacts(path: str, job_id: int) -> list[dict]:
    return queries.artifacts(_db(path), job_id)


def samples_csv(path: str, job_id: int) -> str:
    """Every sample of a job as CSV text (built only when the download is clicked)."""
    return "".join(queries.samples_csv(_db(path), job_id))


def folder_size(folder: Path) -> int:
    """Bytes under a folder (0 when it does not exist)."""
    if not folder.exists():
        return 0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@st.cache_data(ttl=60, show_spinner=False)
def checkpoint_choice(model: str):
    """A checkpoint as the Run page describes it (components, sizes, the loader's default
    component and problems), from headers only."""
    from dashboard.views.checkpoints import describe_checkpoint

    path = Path(model)
    return describe_checkpoint(path, path.parent, config().model_roots)


def expected_bytes(job: dict) -> int | None:
    """Bytes the job will place, in checkpoint dtype: its component, or every
    component for a generate job, or the loader's default component of a load."""
    spec = job.get("spec") or {}
    if not spec.get("model"):
        return None
    choice = checkpoint_choice(spec["model"])
    if not choice.components:
        return None
    return choice.bytes_to_place(job.get("kind", "load"), spec.get("component"))


def artifact_path(job_id: int, name: str) -> Path:
    """A file inside the job's own artifact folder; anything else raises ArtifactError."""
    return resolve_artifact(config().data_dir, job_id, name)


@st.cache_data(ttl=300, show_spinner=False)
def device_info(spec: str) -> DeviceInfo:
    """The probed device (no CUDA context is created); cached, the hardware does not change."""
    return probe_device(spec)


@st.cache_data(ttl=300, show_spinner=False)
def devices() -> list[DeviceInfo]:
    """The CPU plus every CUDA device the driver answers for (probed without a context)."""
    found = [probe_device("cpu")]
    for index in range(16):
        # Whether the device exists is the driver's answer alone: DRAINBOARD_UNIFIED_MEMORY relabels a
        # probe's source, and on a box without CUDA it made 16 phantom GPUs of failed probes.
        if probe_device(f"cuda:{index}", environ={}).source == "probe-failed":
            break
        found.append(probe_device(f"cuda:{index}"))
    return found


HOST_HISTORY_POINTS = 900
"""At most this many stored readings feed the System page's history (each bucket keeps its lowest MemAvailable)."""


@st.cache_data(ttl=5, show_spinner=False)
def host_history(path: str, since: float) -> pd.DataFrame:
    """(time, available) from the samples jobs stored since `since` (epoch seconds): the machine's
    MemAvailable while they ran, so the System page's "last 15 min" covers more than the page's own life.
    Bucketed by time, keeping each bucket's minimum (the peak in use survives)."""
    rows = list(_db(path).query(
        "SELECT j.started_at + s.t AS time, s.mem_available AS available FROM samples s JOIN jobs j ON j.id = s.job_id "
        "WHERE s.rank = 0 AND j.started_at IS NOT NULL AND s.mem_available IS NOT NULL AND j.started_at + s.t >= ? "
        "ORDER BY time", [since]))
    frame = pd.DataFrame(rows, columns=["time", "available"])
    if len(frame) <= HOST_HISTORY_POINTS:
        return frame
    buckets = ((frame["time"] - frame["time"].min()) / (frame["time"].max() - frame["time"].min() + 1e-9)
               * HOST_HISTORY_POINTS).astype(int)
    return frame.loc[frame.groupby(buckets)["available"].idxmin()].reset_index(drop=True)


@st.cache_data(ttl=300, show_spinner=False)
def memory_limit_reason() -> str | None:
    """None when per-job memory limits work on this machine, else why not."""
    from jobs.cgroups import memory_limit_support

    return memory_limit_support()


@st.cache_data(ttl=10, show_spinner=False)
def checkpoints(roots: tuple[str, ...]) -> list:
    """Checkpoints under the model roots, each checked by the loader (headers only)."""
    from dashboard.views.checkpoints import find_checkpoints

    return find_checkpoints([Path(r) for r in roots])


def models(roots: tuple[str, ...]) -> tuple[list, object]:
    """(every checkpoint under the model roots as the Models page lists it, the memory its fit is weighed
    against): headers only, listed again as soon as a file is added or removed two levels down (the depth the
    listing searches), else at most every 10 s."""
    return _models(roots, folder_stamp(roots))


def folder_stamp(roots: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """Each root's and each folder's directly under it modification time: adding or removing an entry in
    either changes it. A few stats, so a page rerun can afford it."""
    stamp = []
    for root in map(Path, roots):
        try:
            folders = [root, *(p for p in root.iterdir() if p.is_dir())]
        except OSError:
            continue
        for folder in folders:
            try:
                stamp.append((str(folder), folder.stat().st_mtime_ns))
            except OSError:
                continue
    return tuple(stamp)


@st.cache_data(ttl=10, show_spinner=False)
def _models(roots: tuple[str, ...], stamp: tuple[tuple[str, int], ...]) -> tuple[list, object]:
    from loader.catalog import find_models, machine_memory

    memory = machine_memory()
    return find_models(roots, memory.bytes), memory


@st.cache_data(ttl=10, show_spinner=False)
def lora_files(roots: tuple[str, ...]) -> list:
    """LoRA files under the model roots (headers only): what the Run page offers."""
    from models.lora.inputs import find_lora_files

    return find_lora_files(roots)


@st.cache_data(ttl=300, show_spinner=False)
def unified_host() -> bool:
    """Whether this machine's GPU shares host memory (the supervisor's own probe, cached)."""
    from jobs.guard import host_has_unified_memory

    return host_has_unified_memory()


def guard_limits(budget: int | None, floor: int | None, total: int):
    """The memory guard's budget and floor for a job with these spec values: the supervisor's own rule
    (an empty floor takes the configured one; "auto" is the default floor on unified memory only)."""
    from jobs.guard import job_limits

    return job_limits(budget, floor, config(), unified=unified_host(), total=total)


def lock_notice(path: str):
    """The worker's wait for another process's lock on the database, or None (`storage.lock_waits`)."""
    from storage.lock_waits import read_lock_notice

    return read_lock_notice(path)


@st.cache_data(ttl=2, show_spinner=False)
def supervisor(path: str) -> dict:
    """jobs.supervisor.supervisor_status: alive, id, pid, heartbeat_age, current_job."""
    from jobs.presence import supervisor_status

    return supervisor_status(_db(path))
