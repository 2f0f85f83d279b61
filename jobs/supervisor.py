"""The supervisor: runs queued jobs one at a time, each in a fresh child process, and says how each ended.

`python -m jobs worker` loops over `Supervisor.tick(now)`. It keeps a heartbeat
row so the dashboard can tell it is alive (`supervisor_status`), and a heartbeat
on the job it runs. Every live supervisor, on start and then every second,
ends `interrupted` the running jobs whose supervisor is gone (dead pid, zombie
included, or a heartbeat older than `STALE_AFTER`) or whose host restarted
under them (another boot id), kills what is left of them and removes their
memory cgroups. While a job runs, its samples come over a pipe (`jobs.samples`)
and a memory guard (`jobs.guard`) watches the machine on its own thread. The
dashboard calls `ensure_supervisor` to start one, detached, when none is alive.

A worker whose database is gone (its data folder deleted, or the file
replaced) stops, its running child killed: it would serve a folder nobody
reads. A worker started on someone's behalf (`ensure_supervisor`: the
dashboard, `jobs submit --wait`) also ends once idle, that is, for
`LAUNCHED_IDLE_EXIT` seconds no job was queued or running and no dashboard
page was open (`Config.dashboard_heartbeat`), and says so in its log. Its fork
server goes with it.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import sqlite_utils

from jobs.backends import backend_for
from jobs.cgroups import CgroupError, JobCgroup, create_job_cgroup, job_cgroup_name, sweep_job_cgroups
from jobs.child import ENV_CGROUP_USAGE, EXIT_DISK_FULL, EXIT_DONE, EXIT_INVALID_SPEC
from jobs.forkserver import ForkedChild, ForkServer
from jobs.guard import (GuardLimits, GuardTrip, Meminfo, MemoryGuard, configured_floor, read_meminfo,
                        spec_limits)
from jobs.kinds import load_kinds
from jobs.liveness import boot_id, is_same_process, pid_alive, process_start
from jobs.outcome import describe_sample, guard_error, kill_reason
from jobs.queue import claim, finish
from jobs.samples import ENV_SAMPLE_FD, SampleRelay, open_sample_pipe
from jobs.setup import prepare_child
from jobs.spec import JobSpec
from core.diskspace import free_bytes, is_disk_full
from core.errors import DiskFullError, DrainboardError
from storage.artifacts import job_dir, new_artifact_path, record_artifact, remove_unrecorded
from storage.config import Config
from storage.connections import checkpoint_wal, is_database_full
from storage.queries import get_job, last_sample, supervisors
from storage.schema import FINAL_STATUSES, open_database

REPO_ROOT = Path(__file__).resolve().parent.parent
HEARTBEAT_INTERVAL = 1.0
"""Seconds between heartbeat writes (the supervisor's row and its job's), and between recovery passes."""
STALE_AFTER = 10.0
"""A supervisor, or a running job, whose heartbeat is older than this is taken for dead."""
START_METHODS = ("fork", "spawn")
"""How a job child starts: forked by the fork server (`jobs.forkserver`, imports paid once), or a fresh
`python -m jobs.child` (imports paid per job; what the fork server is measured against)."""
LAUNCHED_IDLE_EXIT = 600.0
"""Seconds of idleness after which a worker started by `ensure_supervisor` exits (see the module docstring)."""
_HOST = socket.gethostname()


class WorkerGone(DrainboardError):
    """This worker cannot go on: its database is gone or replaced."""


@dataclass
class _Running:
    job_id: int
    process: subprocess.Popen | ForkedChild
    log_path: Path
    cgroup: JobCgroup | None
    relay: SampleRelay
    guard: MemoryGuard | None
    term_sent_at: float | None = None


def _send(process: subprocess.Popen | ForkedChild, sig: int) -> None:
    """Signal the child unless it has already been reaped (Popen checks, so a recycled pid is safe)."""
    try:
        process.send_signal(sig)
    except ProcessLookupError:
        pass


class Supervisor:
    """Runs jobs from the database of `config`, one at a time.

    `grace` is how long a cancelled child gets between SIGTERM and SIGKILL.
    `read_meminfo` is the memory guard's reader of /proc/meminfo (tests pass a fake).
    `start_method` is how job children start (`START_METHODS`); the fork server
    starts with the supervisor, so its imports are done before the first job.
    `idle_exit` (seconds) makes `run` return once idle that long (None: never).
    """

    def __init__(self, config: Config, *, grace: float = 5.0, python: str = sys.executable,
                 read_meminfo: Callable[[], Meminfo] = read_meminfo, start_method: str = "fork",
                 idle_exit: float | None = None):
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {', '.join(START_METHODS)}, got {start_method!r}")
        self.config = config
        self.start_method = start_method
        self._fork_server: ForkServer | None = None
        self.grace = grace
        self.python = python
        self.read_meminfo = read_meminfo
        self.id = f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.boot_id = boot_id()
        self.db = open_database(config.db_path)
        self._db_file = _file_identity(config.db_path)
        self.idle_exit = idle_exit
        self._used_at = time.time()
        """When a job was last in hand or queued, or a dashboard page last seen (wall clock)."""
        self.backend = backend_for(config, self.db, self.id)
        """Where jobs run when not as children here (`jobs.backends`: Ray with `ray_address` set), else None."""
        self.finished: list[int] = []
        """Ids of jobs this supervisor saw to the end, in order."""
        self._running: _Running | None = None
        self._last_heartbeat = float("-inf")
        self._disk_full: str | None = None
        """The disk-full error being retried (said once, until a write succeeds again)."""

    def start(self, now: float | None = None) -> list[int]:
        """Check the settings, register the heartbeat row, end the jobs of dead supervisors and sweep their
        cgroups; returns those ids. A bad setting raises `ConfigError` here, before any job is claimed (a
        job claimed and then failed for it would strand the queue, one job per restart)."""
        configured_floor(self.config)
        load_kinds()
        now = time.time() if now is None else now
        self.db["supervisors"].insert({"id": self.id, "pid": os.getpid(), "host": _HOST, "started_at": now,
                                       "heartbeat_at": now, "boot_id": self.boot_id})
        self._last_heartbeat = now
        if self.start_method == "fork" and self._fork_server is None and self.backend is None:
            self._fork_server = ForkServer(self.python, worker_env(self.config), str(REPO_ROOT))
        recovered = self.recover_interrupted(now)
        sweep_job_cgroups(supervisor_alive=pid_alive)
        return recovered

    def recover_interrupted(self, now: float) -> list[int]:
        """End `interrupted` every running job (not this supervisor's) whose supervisor is gone or whose
        host restarted; kill what is left of it, remove its cgroup and partial files. Returns their ids."""
        by_id = {s["id"]: s for s in supervisors(self.db)}
        recovered = []
        for job in self.db.query("SELECT * FROM jobs WHERE status = 'running' AND supervisor_id IS NOT ?",
                                 [self.id]):
            reason = self._why_orphaned(job, by_id.get(job["supervisor_id"]), now)
            if reason is None:
                continue
            same_boot = job["boot_id"] in (None, self.boot_id)
            if same_boot and str(job["supervisor_id"]).startswith(f"{_HOST}:") and \
                    is_same_process(job["pid"], job["pid_start"]):
                try:
                    os.kill(job["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
            sweep_job_cgroups([job["id"]], supervisor_alive=pid_alive)
            self._keep_logs_only(job["id"])
            last = describe_sample(last_sample(self.db, job["id"]), job["progress_total"])
            if finish(self.db, job["id"], "interrupted", error=f"interrupted: {reason}; {last}"):
                recovered.append(job["id"])
        return recovered

    def _why_orphaned(self, job: dict, owner: dict | None, now: float) -> str | None:
        """Why `job` can no longer be running, or None while its supervisor may still be running it."""
        if job["boot_id"] is not None and job["boot_id"] != self.boot_id:
            return "the host restarted while this job ran"
        who = f"its supervisor ({job['supervisor_id']})"
        if owner is not None and not _is_alive(owner, now, self.boot_id):
            return f"{who} stopped while the job was running"
        heartbeat = job["heartbeat_at"] or job["started_at"] or 0.0
        if now - heartbeat > STALE_AFTER:
            return f"{who} stopped tending the job (no heartbeat for {now - heartbeat:.0f} s)"
        return None

    def tick(self, now: float | None = None) -> bool:
        """One pass: heartbeat and recovery, watch the running child (cancel, exit) or start the next job.

        Returns True while there is work in hand, False when idle. A full disk
        does not stop the supervisor: the write is retried on the next tick (a
        finished child stays in hand until its end is recorded), and said once.
        """
        try:
            busy = self._tick(time.time() if now is None else now)
        except Exception as e:
            if not (is_database_full(e) or is_disk_full(e)):
                raise
            if self._disk_full is None:
                _say(f"supervisor {self.id}: disk full, retrying until there is room: {e} "
                     f"({free_bytes(self.config.db_path):,} bytes free for {self.config.db_path})")
            self._disk_full = str(e)
            checkpoint_wal(self.db)
            return True
        return busy

    def _tick(self, now: float) -> bool:
        self._check_database()  # every tick: a claim from a deleted database would recreate its folder
        if self.backend is not None:
            return self._backend_tick(now)
        if self._running is not None:
            self._watch(now)  # first: a full disk that fails the heartbeat must not keep a job from ending
        if now - self._last_heartbeat >= HEARTBEAT_INTERVAL:
            self._heartbeat(now)
            self.recover_interrupted(now)
        if self._running is not None:
            return True
        job = claim(self.db, self.id, boot_id=self.boot_id)
        if job is None:
            return False
        self._spawn(job)
        return True

    def _check_database(self) -> None:
        """Raise `WorkerGone` once the database file this worker opened is no longer at its path."""
        if _file_identity(self.config.db_path) != self._db_file:
            where = "its data folder was deleted" if not self.config.data_dir.is_dir() else "the file was removed or replaced"
            raise WorkerGone(f"supervisor {self.id}: the job database {self.config.db_path} is gone ({where}); "
                             f"this worker stops")

    def idle_for(self, now: float | None = None) -> float:
        """Seconds since a job was last queued or in hand, or a dashboard page last open."""
        now = time.time() if now is None else now
        if self._running is not None or self.db.execute("SELECT 1 FROM jobs WHERE status IN ('queued', 'running') "
                                                        "LIMIT 1").fetchone():
            self._used_at = now
        try:
            self._used_at = max(self._used_at, self.config.dashboard_heartbeat.stat().st_mtime)
        except OSError:
            pass
        return max(0.0, now - self._used_at)

    def _backend_tick(self, now: float) -> bool:
        """`_tick` with a backend: the same heartbeat and recovery; the backend starts and watches the job."""
        current = self.backend.running_job()
        if current is not None and not self.backend.watch(now):
            self.finished.append(current)
            self._last_heartbeat = float("-inf")  # say at once that this supervisor is free
        if now - self._last_heartbeat >= HEARTBEAT_INTERVAL:
            self._heartbeat(now)
            self.recover_interrupted(now)
        if self.backend.running_job() is not None:
            return True
        if not self.backend.ready(now):
            return False
        job = claim(self.db, self.id, boot_id=self.boot_id)
        if job is None:
            return False
        self.backend.start(job)
        if self.backend.running_job() is None:  # refused: already ended
            self.finished.append(job["id"])
        return True

    def _heartbeat(self, now: float) -> None:
        self._last_heartbeat = now
        current = self.backend.running_job() if self.backend else self._running.job_id if self._running else None
        self.db.execute("UPDATE supervisors SET heartbeat_at = ?, current_job = ? WHERE id = ?",
                        [now, current, self.id])
        if current is not None:
            self.db.execute("UPDATE jobs SET heartbeat_at = ? WHERE id = ?", [now, current])
        if self._disk_full is not None:
            self._disk_full = None
            _say(f"supervisor {self.id}: the database takes writes again")

    def _fail_to_start(self, job_id: int, error: str) -> None:
        finish(self.db, job_id, "failed", error=error)
        self.finished.append(job_id)

    def _spawn(self, job: dict) -> None:
        spec = JobSpec.from_dict(job["spec"])
        cgroup = None
        if spec.memory_limit is not None:
            try:
                cgroup = create_job_cgroup(job_cgroup_name(job["id"], os.getpid()), spec.memory_limit)
            except CgroupError as e:
                return self._fail_to_start(job["id"], f"memory limit could not be applied: {e}")
        try:
            log_path = new_artifact_path(self.config.data_dir, job["id"], "child", ".log")
            log_path.touch()
        except OSError as e:
            if not is_disk_full(e):
                raise
            if cgroup:
                cgroup.remove()
            return self._fail_to_start(job["id"], f"disk full: cannot create the job's log in "
                                                  f"{self.config.artifacts_dir}: {e}")
        limits = self._guard_limits(spec)
        read_fd, write_fd = open_sample_pipe()
        try:
            with open(log_path, "wb") as log:
                process = self._start_child(job["id"], cgroup, log, write_fd)
        finally:
            os.close(write_fd)  # the child holds the only write end: its exit ends the relay's stream
        guard = None
        if limits.active:
            guard = MemoryGuard(limits, lambda sig: _send(process, sig), read=self.read_meminfo,
                                snapshot=lambda: relay.last)
        relay = SampleRelay(self.config.db_path, job["id"], read_fd, on_start=guard.begin if guard else None)
        if guard:
            guard.start()
        self._running = _Running(job["id"], process, log_path, cgroup, relay, guard)
        self.db.execute("UPDATE jobs SET pid = ?, pid_start = ? WHERE id = ?",
                        [process.pid, process_start(process.pid), job["id"]])
        self._heartbeat(time.time())

    def _start_child(self, job_id: int, cgroup: JobCgroup | None, log, sample_fd: int):
        """The job's child process (a Popen, or the fork server's `ForkedChild`)."""
        env = self._child_env(cgroup, sample_fd)
        procs = str(cgroup.procs_file) if cgroup else None
        if self.start_method == "fork":
            if self._fork_server is None or not self._fork_server.alive():
                self._fork_server = ForkServer(self.python, worker_env(self.config), str(REPO_ROOT))
            return self._fork_server.spawn(job_id, env, log.fileno(), sample_fd, procs)
        return subprocess.Popen(
            [self.python, "-m", "jobs.child", str(job_id)], cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, pass_fds=(sample_fd,), preexec_fn=lambda: prepare_child(procs),
        )

    def _guard_limits(self, spec: JobSpec) -> GuardLimits:
        """The memory guard's budget and floor for `spec` (the unified-memory probe only when it matters)."""
        return spec_limits(spec.memory_budget, spec.memory_floor, self.config, read=self.read_meminfo)

    def _child_env(self, cgroup: JobCgroup | None, sample_fd: int) -> dict[str, str]:
        """What a job child runs with: this process's environment, pinned to this supervisor's data and roots."""
        env = worker_env(self.config)
        env[ENV_SAMPLE_FD] = str(sample_fd)
        if cgroup is not None:
            env[ENV_CGROUP_USAGE] = str(cgroup.usage_file)
        return env

    def _watch(self, now: float) -> None:
        running = self._running
        code = running.process.poll()
        if code is None:
            if running.relay.error is not None:  # its samples cannot be stored: every write it makes eats the room left
                _send(running.process, signal.SIGKILL)
                return
            cancel = self.db.execute("SELECT cancel_requested FROM jobs WHERE id = ?", [running.job_id]).fetchone()[0]
            if cancel and running.term_sent_at is None:
                _send(running.process, signal.SIGTERM)
                running.term_sent_at = now
            elif running.term_sent_at is not None and now - running.term_sent_at >= self.grace:
                _send(running.process, signal.SIGKILL)
            return
        if running.guard:
            running.guard.stop()
        running.relay.close()  # every sample the child wrote is in the database before its end is told
        self._record_exit(running, code)
        self._running = None
        self.finished.append(running.job_id)
        self._last_heartbeat = float("-inf")  # say at once that this supervisor is free

    def _record_exit(self, running: _Running, code: int) -> None:
        """Record how the child ended: succeeded, failed, killed (signal or memory guard named), or cancelled."""
        job = get_job(self.db, running.job_id)
        oom_kills = running.cgroup.oom_kills() if running.cgroup else None
        if running.cgroup:
            running.cgroup.remove()
        missing = None if running.log_path.is_file() else \
            f"the job's artifact folder {running.log_path.parent} was deleted while it ran: its log and outputs are gone"
        if job["status"] not in FINAL_STATUSES:  # else another supervisor took it for dead meanwhile
            self._record_end(running, job, code, oom_kills, missing)
        if missing is None:
            record_artifact(self.db, self.config.data_dir, running.job_id, running.log_path)
        else:
            _say(f"supervisor {self.id}: job {running.job_id}: {missing}")

    def _record_end(self, running: _Running, job: dict, code: int, oom_kills: int | None, missing: str | None) -> None:
        """The job's final status and error; written first, since on a nearly full disk it matters most.
        `missing` says what of the job's folder is gone: added to the error, or a warning event of a success."""
        metrics = {"memory_limit": running.cgroup.limit, "cgroup_oom_kills": oom_kills} if running.cgroup else None
        signal_name = signal.Signals(-code).name if code < 0 else None
        trip = running.guard.trip if running.guard else None
        if trip is not None:
            self._record_guard_event(running, trip)
            status, error = "killed", guard_error(trip, job["progress_total"])
            metrics = {**(metrics or {}), "memory_guard": trip.to_dict()}
        elif running.relay.error is not None:  # the job was stopped: its samples could not be stored
            status, error = "failed", self._disk_full_error(running, code) \
                or f"the job's samples could not be stored: {running.relay.error}"
        elif job["cancel_requested"]:
            status, error = "cancelled", f"cancelled while running{f' ({signal_name})' if signal_name else ''}"
        elif code == EXIT_DONE:
            status, error = "succeeded", None
        elif code > 0:
            status, error = "failed", job["error"] or self._disk_full_error(running, code) \
                or _log_tail(running.log_path) or f"the job process exited with code {code}"
            if code == EXIT_INVALID_SPEC and not error.startswith("invalid spec"):
                error = f"invalid spec: {error}"
        else:
            limit = running.cgroup.limit if running.cgroup else None
            last = describe_sample(last_sample(self.db, job["id"]), job["progress_total"])
            status = "killed"
            error = f"{kill_reason(signal_name, limit=limit, oom_kills=oom_kills)}; {last}"
        if status != "succeeded":
            remove_unrecorded(self.db, self.config.data_dir, job["id"], keep=(running.log_path.name,))
        if missing is not None and status == "succeeded":
            self.db["events"].insert({"job_id": job["id"], "t": (running.relay.last or {}).get("t", 0.0),
                                      "created_at": time.time(), "kind": "warning", "stage": None,
                                      "message": missing, "data": None})
        elif missing is not None:
            error = f"{error}; {missing}" if error else missing
        finish(self.db, job["id"], status, error=error, exit_code=code, signal=signal_name, metrics=metrics)

    def _keep_logs_only(self, job_id: int) -> None:
        """A job that died unattended: register its child log, delete what else it left unregistered."""
        for log in sorted(job_dir(self.config.data_dir, job_id).glob("child*.log")):
            record_artifact(self.db, self.config.data_dir, job_id, log)
        remove_unrecorded(self.db, self.config.data_dir, job_id)

    def _disk_full_error(self, running: _Running, code: int) -> str | None:
        """The error of a job whose samples or error the database refused for lack of room."""
        error = running.relay.error
        refused = error if error is not None and (isinstance(error, DiskFullError) or is_database_full(error)) else None
        if code != EXIT_DISK_FULL and refused is None:
            return None
        what = "its samples" if refused is not None else "its error"
        return (f"disk full: cannot write to the database {self.config.db_path} "
                f"({free_bytes(self.config.db_path):,} bytes free): the job could not record {what}"
                + (f": {refused}" if refused is not None else ""))

    def _record_guard_event(self, running: _Running, trip: GuardTrip) -> None:
        """The guard's stop as a job event at the moment of the trip (drawn on the Job chart like an OOM kill)."""
        t0 = running.relay.t0
        t = trip.at - t0 if t0 is not None else (trip.sample or {}).get("t", 0.0)
        self.db["events"].insert({"job_id": running.job_id, "t": t, "created_at": time.time(), "kind": "memory_guard",
                                  "stage": (trip.sample or {}).get("stage"), "message": f"memory guard: {trip.message}",
                                  "data": json.dumps(trip.to_dict())})

    def stop(self) -> None:
        """Stop the running child (its job becomes interrupted) and sign off.

        On a full disk the job cannot be marked here; the next supervisor's start marks it interrupted.
        """
        try:
            if self.backend is not None:
                self.backend.stop()
            if self._running is not None:
                running, self._running = self._running, None
                running.process.kill()
                running.process.wait()
                if running.guard:
                    running.guard.stop()
                running.relay.close()
                if running.cgroup:
                    running.cgroup.remove()
                self._keep_logs_only(running.job_id)
                last = describe_sample(last_sample(self.db, running.job_id), None)
                finish(self.db, running.job_id, "interrupted", error=f"interrupted: the supervisor was stopped; {last}")
            self.db.execute("UPDATE supervisors SET stopped_at = ?, current_job = NULL WHERE id = ?",
                            [time.time(), self.id])
            if self._fork_server is not None:
                self._fork_server.close()
                self._fork_server = None
        except Exception as e:
            if not (is_database_full(e) or is_disk_full(e)):
                raise
            _say(f"supervisor {self.id}: disk full while stopping, the next start records what is left: {e}")

    def run(self, *, once: bool = False, poll: float = 0.2) -> None:
        """Loop until stopped (SIGTERM, Ctrl-C); with `once`, run at most one job (none if none is queued);
        with `idle_exit`, until idle that long. Raises `WorkerGone` (after stopping) when the database is gone."""
        previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        self.start()
        try:
            while True:
                busy = self.tick()
                if once and (not busy or (self.finished and self._running is None)):
                    return
                if not busy and self.idle_exit is not None and self.idle_for() >= self.idle_exit:
                    _say(f"supervisor {self.id}: idle for {self.idle_exit:g} s (no job queued or running, no "
                         f"dashboard page open), and it was started on someone's behalf: exiting")
                    return
                time.sleep(poll / 4 if busy else poll)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()
            signal.signal(signal.SIGTERM, previous)


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`, None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _raise_keyboard_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def worker_env(config: Config) -> dict[str, str]:
    """The environment of a process this package starts (a job child, a worker): this one's, pinned to
    `config`'s data folder and model roots, with the repository importable."""
    env = dict(os.environ)
    env.update(
        DRAINBOARD_DATA=str(config.data_dir),
        DRAINBOARD_MODEL_ROOTS=os.pathsep.join(str(r) for r in config.model_roots),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )
    if config.memory_floor is not None:
        env["DRAINBOARD_MEMORY_FLOOR"] = config.memory_floor
    if config.ray_address is not None:
        env["DRAINBOARD_RAY_ADDRESS"] = config.ray_address
    env.pop("DRAINBOARD_CONFIG", None)
    return env


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


def _is_alive(row: dict, now: float, current_boot: str | None = None) -> bool:
    """Whether a supervisor row belongs to a live supervisor: fresh heartbeat, not stopped, same boot,
    and (on this host) a pid that is neither gone nor a zombie."""
    if row["stopped_at"] is not None or now - row["heartbeat_at"] > STALE_AFTER:
        return False
    if row.get("boot_id") and row["boot_id"] != (current_boot or boot_id()):
        return False
    return row["host"] != _HOST or pid_alive(row["pid"])


def supervisor_status(db: sqlite_utils.Database, now: float | None = None) -> dict:
    """Whether a supervisor is alive, for the dashboard: `alive`, `id`, `pid`, `heartbeat_age`, `current_job`."""
    now = time.time() if now is None else now
    current_boot = boot_id()
    for row in supervisors(db):
        if _is_alive(row, now, current_boot):
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
