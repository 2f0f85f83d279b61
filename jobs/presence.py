"""Whether a supervisor is alive, and starting one, detached, when none is.

A supervisor (`jobs.supervisor`) keeps a heartbeat row in `supervisors`; the
dashboard and `jobs submit --wait` read it here, and `ensure_supervisor` starts
`python -m jobs worker` when no row is live. A worker started that way exits
once idle for `LAUNCHED_IDLE_EXIT` seconds.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import sqlite_utils

from jobs.liveness import boot_id, pid_alive
from storage.config import Config
from storage.lock_waits import LockNotice, read_lock_notice
from storage.schema import open_database
from storage.queries import supervisors

REPO_ROOT = Path(__file__).resolve().parent.parent
STALE_AFTER = 10.0
"""A supervisor, or a running job, whose heartbeat is older than this is taken for dead."""
LAUNCHED_IDLE_EXIT = 600.0
"""Seconds of idleness after which a worker started by `ensure_supervisor` exits (see `jobs.supervisor`)."""
HOST = socket.gethostname()


def is_alive(row: dict, now: float, current_boot: str | None = None, lock_notice: LockNotice | None = None) -> bool:
    """Whether a supervisor row belongs to a live supervisor: fresh heartbeat (or a stale one while its
    `lock_notice` says it waits for another process's lock), not stopped, same boot, and (on this host) a
    pid that is neither gone nor a zombie."""
    waiting = lock_notice is not None and lock_notice.owner == row["id"]
    if row["stopped_at"] is not None or (now - row["heartbeat_at"] > STALE_AFTER and not waiting):
        return False
    if row.get("boot_id") and row["boot_id"] != (current_boot or boot_id()):
        return False
    return row["host"] != HOST or pid_alive(row["pid"])


def lock_notice_of(db: sqlite_utils.Database) -> LockNotice | None:
    """The wait a worker is in for this database's lock (`storage.lock_waits`), or None."""
    file = db.execute("PRAGMA database_list").fetchone()[2]  # "" for a database in memory
    return read_lock_notice(file) if file else None


def supervisor_status(db: sqlite_utils.Database, now: float | None = None) -> dict:
    """Whether a supervisor is alive, for the dashboard: `alive`, `id`, `pid`, `heartbeat_age`, `current_job`."""
    now = time.time() if now is None else now
    current_boot = boot_id()
    notice = lock_notice_of(db)
    for row in supervisors(db):
        if is_alive(row, now, current_boot, notice):
            return {"alive": True, "id": row["id"], "pid": row["pid"], "heartbeat_age": now - row["heartbeat_at"],
                    "current_job": row["current_job"]}
    return {"alive": False, "id": None, "pid": None, "heartbeat_age": None, "current_job": None}


def ensure_supervisor(config: Config, *, wait: float = 10.0) -> dict:
    """Start `python -m jobs worker` in the background unless a supervisor is alive; returns its status.

    Detached by `jobs.daemon` (double fork, own session): it outlives the
    dashboard and is never left a zombie of it. Its output goes to
    `<data_dir>/worker.log`. A lock file keeps two callers from starting two. It exits once idle for
    `LAUNCHED_IDLE_EXIT` seconds (see the module docstring).
    A worker started here is named by `launched_pid`, also when it was not yet alive by `wait`.
    """
    config.data_dir.mkdir(parents=True, exist_ok=True)
    with open(config.data_dir / "worker.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        db = open_database(config.db_path)
        try:
            status = supervisor_status(db)
            if status["alive"]:
                return status
            with open(config.data_dir / "worker.log", "ab") as log:
                launched = subprocess.run([sys.executable, "-m", "jobs.daemon", "worker", "--exit-when-idle",
                                           f"{LAUNCHED_IDLE_EXIT:g}"], cwd=REPO_ROOT,
                                          env=worker_env(config), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=log, check=True)
            worker_pid = int(launched.stdout.split()[0])
            deadline = time.time() + wait
            while time.time() < deadline:
                status = supervisor_status(db)
                if status["alive"] or not pid_alive(worker_pid):
                    break
                time.sleep(0.1)
            return {**status, "launched_pid": worker_pid}
        finally:
            db.conn.close()


def worker_env(config: Config) -> dict[str, str]:
    """The environment of a process this package starts (a job child, a worker): this one's, pinned to
    `config`'s data folder and model roots, with the repository importable."""
    env = dict(os.environ)
    env.update(
        DRAINBOARD_DATA=str(config.data_dir),
        DRAINBOARD_MODEL_ROOTS=os.pathsep.join(str(r) for r in config.model_roots),
        DRAINBOARD_HUB_CACHE="off",  # the roots just pinned hold the Hugging Face cache already when it is on
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )
    if config.memory_floor is not None:
        env["DRAINBOARD_MEMORY_FLOOR"] = config.memory_floor
    if config.ray_address is not None:
        env["DRAINBOARD_RAY_ADDRESS"] = config.ray_address
    env.pop("DRAINBOARD_CONFIG", None)
    return env
