"""The supervisor: runs queued jobs one at a time, each in a fresh child process, and says how each ended.

`python -m jobs worker` loops over `Supervisor.tick(now)`. It keeps a heartbeat
row so the dashboard can tell it is alive (`supervisor_status`), and on start
marks jobs a dead supervisor left running as interrupted. The dashboard calls
`ensure_supervisor` to start one in the background when none is alive.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import sqlite_utils

from jobs.cgroups import CgroupError, JobCgroup, create_job_cgroup
from jobs.child import ENV_CGROUP_USAGE, EXIT_DISK_FULL, EXIT_DONE, EXIT_INVALID_SPEC
from jobs.queue import claim, finish
from jobs.spec import JobSpec
from loader.diskspace import free_bytes, is_disk_full
from storage.artifacts import new_artifact_path, record_artifact
from storage.config import Config
from storage.connections import connect, is_database_full
from storage.queries import get_job, last_sample, supervisors

REPO_ROOT = Path(__file__).resolve().parent.parent
HEARTBEAT_INTERVAL = 1.0
"""Seconds between heartbeat writes."""
STALE_AFTER = 10.0
"""A supervisor whose heartbeat is older than this is taken for dead."""
CHILD_OOM_SCORE_BONUS = 500
"""Added to the child's oom_score_adj so the kernel picks the job before the supervisor or dashboard."""
_PR_SET_PDEATHSIG = 1
_HOST = socket.gethostname()


@dataclass
class _Running:
    job_id: int
    process: subprocess.Popen
    log_path: Path
    cgroup: JobCgroup | None
    term_sent_at: float | None = None


def _gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.2f} GiB"


def describe_sample(sample: dict | None, total: int | None) -> str:
    """One line quoting the last recorded sample: stage, tensor k of N, memory."""
    if sample is None:
        return "no sample was recorded"
    parts = [f"stage {sample['stage'] or 'unknown'}"]
    if sample.get("tensors_placed") is not None:
        of = f" of {total}" if total else ""
        name = f" ({sample['tensor_name']})" if sample.get("tensor_name") else ""
        parts.append(f"tensor {sample['tensors_placed']}{of}{name}")
    parts.append(f"VmRSS {_gib(sample['vm_rss'])}")
    parts.append(f"MemAvailable {_gib(sample['mem_available'])}")
    if sample.get("device_allocated"):
        parts.append(f"device allocated {_gib(sample['device_allocated'])}")
    if sample.get("cgroup_usage") is not None:
        parts.append(f"cgroup usage {_gib(sample['cgroup_usage'])}")
    return f"last sample at {sample['t']:.1f} s: " + ", ".join(parts)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_job_child(pid: int, job_id: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"jobs.child" in cmdline and str(job_id).encode() in cmdline


class Supervisor:
    """Runs jobs from the database of `config`, one at a time.

    `grace` is how long a cancelled child gets between SIGTERM and SIGKILL.
    """

    def __init__(self, config: Config, *, grace: float = 5.0, python: str = sys.executable):
        self.config = config
        self.grace = grace
        self.python = python
        self.id = f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.db = connect(config.db_path)
        self.finished: list[int] = []
        """Ids of jobs this supervisor saw to the end, in order."""
        self._running: _Running | None = None
        self._last_heartbeat = float("-inf")
        self._disk_full: str | None = None
        """The disk-full error last reported (said once, not every tick)."""

    def start(self, now: float | None = None) -> list[int]:
        """Register the heartbeat row and mark jobs of dead supervisors interrupted; returns those ids."""
        now = time.time() if now is None else now
        self.db.execute(
            "INSERT INTO supervisors (id, pid, host, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?)",
            [self.id, os.getpid(), _HOST, now, now],
        )
        self._last_heartbeat = now
        return self.recover_interrupted(now)

    def recover_interrupted(self, now: float) -> list[int]:
        """Mark running jobs whose supervisor is gone as interrupted (and kill their orphaned children)."""
        alive = {s["id"] for s in supervisors(self.db) if _is_alive(s, now)} | {self.id}
        orphans = [r for r in self.db.query("SELECT id, pid, supervisor_id FROM jobs WHERE status = 'running'")
                   if r["supervisor_id"] not in alive]
        for job in orphans:
            if job["pid"] and _is_job_child(job["pid"], job["id"]):
                os.kill(job["pid"], signal.SIGKILL)
            finish(self.db, job["id"], "interrupted",
                   error=f"interrupted: its supervisor ({job['supervisor_id']}) stopped while the job was running")
        return [job["id"] for job in orphans]

    def tick(self, now: float | None = None) -> bool:
        """One pass: heartbeat, watch the running child (cancel, exit) or start the next job.

        Returns True while there is work in hand, False when idle. A full disk
        does not stop the supervisor: the write is retried on the next tick (a
        finished child stays in hand until its end is recorded).
        """
        try:
            busy = self._tick(time.time() if now is None else now)
        except Exception as e:
            if not (is_database_full(e) or is_disk_full(e)):
                raise
            if str(e) != self._disk_full:
                self._disk_full = str(e)
                _say(f"supervisor {self.id}: disk full, retrying every tick: {e} "
                     f"({free_bytes(self.config.db_path):,} bytes free for {self.config.db_path})")
            return True
        self._disk_full = None
        return busy

    def _tick(self, now: float) -> bool:
        if now - self._last_heartbeat >= HEARTBEAT_INTERVAL:
            self._heartbeat(now)
        if self._running is not None:
            self._watch(now)
            return True
        job = claim(self.db, self.id)
        if job is None:
            return False
        self._spawn(job)
        return True

    def _heartbeat(self, now: float) -> None:
        self._last_heartbeat = now
        current = self._running.job_id if self._running else None
        self.db.execute("UPDATE supervisors SET heartbeat_at = ?, current_job = ? WHERE id = ?",
                        [now, current, self.id])

    def _spawn(self, job: dict) -> None:
        spec = JobSpec.from_dict(job["spec"])
        cgroup = None
        if spec.memory_limit is not None:
            try:
                cgroup = create_job_cgroup(f"drainboard-job-{job['id']}-{os.getpid()}", spec.memory_limit)
            except CgroupError as e:
                finish(self.db, job["id"], "failed", error=f"memory limit could not be applied: {e}")
                self.finished.append(job["id"])
                return
        try:
            log_path = new_artifact_path(self.config.data_dir, job["id"], "child", ".log")
            log_path.touch()
        except OSError as e:
            if not is_disk_full(e):
                raise
            finish(self.db, job["id"], "failed", error=f"disk full: cannot create the job's log in "
                                                       f"{self.config.artifacts_dir}: {e}")
            self.finished.append(job["id"])
            return
        env = dict(os.environ)
        env.update(
            DRAINBOARD_DATA=str(self.config.data_dir),
            DRAINBOARD_MODEL_ROOTS=os.pathsep.join(str(r) for r in self.config.model_roots),
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        )
        env.pop("DRAINBOARD_CONFIG", None)
        if cgroup is not None:
            env[ENV_CGROUP_USAGE] = str(cgroup.usage_file)
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [self.python, "-m", "jobs.child", str(job["id"])],
                cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=_child_setup(cgroup),
            )
        self._running = _Running(job["id"], process, log_path, cgroup)
        self.db.execute("UPDATE jobs SET pid = ? WHERE id = ?", [process.pid, job["id"]])
        self._heartbeat(time.time())

    def _watch(self, now: float) -> None:
        running = self._running
        code = running.process.poll()
        if code is None:
            cancel = self.db.execute("SELECT cancel_requested FROM jobs WHERE id = ?", [running.job_id]).fetchone()[0]
            if cancel and running.term_sent_at is None:
                running.process.send_signal(signal.SIGTERM)
                running.term_sent_at = now
            elif running.term_sent_at is not None and now - running.term_sent_at >= self.grace:
                running.process.kill()
            return
        self._account(running, code)
        self._running = None
        self.finished.append(running.job_id)
        self._heartbeat(now)

    def _account(self, running: _Running, code: int) -> None:
        """Record how the child ended: succeeded, failed, killed (signal named), or cancelled."""
        job = get_job(self.db, running.job_id)
        oom_kills = running.cgroup.oom_kills() if running.cgroup else None
        if running.cgroup:
            running.cgroup.remove()
        record_artifact(self.db, self.config.data_dir, running.job_id, running.log_path)
        metrics = {"memory_limit": running.cgroup.limit, "cgroup_oom_kills": oom_kills} if running.cgroup else None
        signal_name = signal.Signals(-code).name if code < 0 else None
        if job["cancel_requested"]:
            how = f" ({signal_name})" if signal_name else ""
            finish(self.db, job["id"], "cancelled", error=f"cancelled while running{how}", exit_code=code,
                   signal=signal_name, metrics=metrics)
        elif code == EXIT_DONE:
            finish(self.db, job["id"], "succeeded", exit_code=code, metrics=metrics)
        elif code > 0:
            error = job["error"] or (
                f"disk full: the job could not record its error in {self.config.db_path} "
                f"({free_bytes(self.config.db_path):,} bytes free)" if code == EXIT_DISK_FULL else None
            ) or _log_tail(running.log_path) or f"the job process exited with code {code}"
            if code == EXIT_INVALID_SPEC and not error.startswith("invalid spec"):
                error = f"invalid spec: {error}"
            finish(self.db, job["id"], "failed", error=error, exit_code=code, metrics=metrics)
        else:
            last = describe_sample(last_sample(self.db, job["id"]), job["progress_total"])
            if signal_name == "SIGKILL" and oom_kills:
                why = (f"killed (SIGKILL) by the kernel OOM killer in the job's memory cgroup: limit "
                       f"{_gib(running.cgroup.limit)} reached (cgroup oom_kill count {oom_kills})")
            elif signal_name == "SIGKILL":
                why = "killed (SIGKILL), most likely by the kernel OOM killer"
            else:
                why = f"killed by {signal_name}"
            finish(self.db, job["id"], "killed", error=f"{why}; {last}", exit_code=code, signal=signal_name,
                   metrics=metrics)

    def stop(self) -> None:
        """Stop the running child (its job becomes interrupted) and sign off.

        On a full disk the job cannot be marked here; the next supervisor's start marks it interrupted.
        """
        try:
            if self._running is not None:
                self._running.process.kill()
                self._running.process.wait()
                if self._running.cgroup:
                    self._running.cgroup.remove()
                running, self._running = self._running, None
                finish(self.db, running.job_id, "interrupted", error="interrupted: the supervisor was stopped")
            self.db.execute("UPDATE supervisors SET stopped_at = ?, current_job = NULL WHERE id = ?",
                            [time.time(), self.id])
        except Exception as e:
            if not (is_database_full(e) or is_disk_full(e)):
                raise
            _say(f"supervisor {self.id}: disk full while stopping, the next start records what is left: {e}")

    def run(self, *, once: bool = False, poll: float = 0.2) -> None:
        """Loop until stopped (SIGTERM, Ctrl-C); with `once`, run at most one job (none if none is queued)."""
        previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        self.start()
        try:
            while True:
                busy = self.tick()
                if once and (not busy or (self.finished and self._running is None)):
                    return
                time.sleep(poll / 4 if busy else poll)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()
            signal.signal(signal.SIGTERM, previous)


def _raise_keyboard_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _child_setup(cgroup: JobCgroup | None):
    """Runs in the child between fork and exec: join the cgroup, die with the supervisor, be the OOM victim."""
    procs_file = str(cgroup.procs_file) if cgroup else None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        libc = None

    def setup() -> None:
        if procs_file:
            with open(procs_file, "w") as f:
                f.write(str(os.getpid()))
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        try:
            with open("/proc/self/oom_score_adj", "r+") as f:
                current = int(f.read())
                f.seek(0)
                f.write(str(min(1000, current + CHILD_OOM_SCORE_BONUS)))
        except OSError:
            pass

    return setup


def _say(line: str) -> None:
    """One line to stderr (the worker log), which a full disk may refuse too."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def _log_tail(path: Path) -> str | None:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    return lines[-1] if lines else None


def _is_alive(row: dict, now: float) -> bool:
    if row["stopped_at"] is not None or now - row["heartbeat_at"] > STALE_AFTER:
        return False
    return row["host"] != _HOST or _pid_alive(row["pid"])


def supervisor_status(db: sqlite_utils.Database, now: float | None = None) -> dict:
    """Whether a supervisor is alive, for the dashboard: `alive`, `id`, `pid`, `heartbeat_age`, `current_job`."""
    now = time.time() if now is None else now
    for row in supervisors(db):
        if _is_alive(row, now):
            return {"alive": True, "id": row["id"], "pid": row["pid"], "heartbeat_age": now - row["heartbeat_at"],
                    "current_job": row["current_job"]}
    return {"alive": False, "id": None, "pid": None, "heartbeat_age": None, "current_job": None}


def ensure_supervisor(config: Config, *, wait: float = 10.0) -> dict:
    """Start `python -m jobs worker` in the background unless a supervisor is alive; returns its status.

    Detached (its own session) so it outlives the dashboard; its output goes
    to `<data_dir>/worker.log`. A lock file keeps two callers from starting two.
    """
    config.data_dir.mkdir(parents=True, exist_ok=True)
    with open(config.data_dir / "worker.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        db = connect(config.db_path)
        try:
            status = supervisor_status(db)
            if status["alive"]:
                return status
            env = dict(os.environ, DRAINBOARD_DATA=str(config.data_dir),
                       DRAINBOARD_MODEL_ROOTS=os.pathsep.join(str(r) for r in config.model_roots),
                       PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
            env.pop("DRAINBOARD_CONFIG", None)
            with open(config.data_dir / "worker.log", "ab") as log:
                process = subprocess.Popen([sys.executable, "-m", "jobs", "worker"], cwd=REPO_ROOT, env=env,
                                           stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
            deadline = time.time() + wait
            while time.time() < deadline:
                status = supervisor_status(db)
                if status["alive"] or process.poll() is not None:
                    break
                time.sleep(0.1)
            return status
        finally:
            db.conn.close()
