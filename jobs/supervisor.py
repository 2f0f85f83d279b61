"""The supervisor: runs queued jobs one at a time, each in a fresh child process, and says how each ended.

`python -m jobs worker` loops over `Supervisor.tick(now)`. It keeps a heartbeat
row so the dashboard can tell it is alive (`jobs.presence`), and a heartbeat
on the job it runs. Every live supervisor, on start and then every second,
ends `interrupted` the running jobs whose supervisor is gone (dead pid, zombie
included, or a heartbeat older than `STALE_AFTER`) or whose host restarted
under them (another boot id), kills what is left of them and removes their
memory cgroups. While a job runs, its samples come over a pipe (`jobs.samples`)
and a memory guard (`jobs.guard`) watches the machine on its own thread; how it
ended is recorded by `jobs.ending`. The dashboard calls
`jobs.presence.ensure_supervisor` to start one, detached, when none is alive.

A worker whose database is gone (its data folder deleted, or the file
replaced) stops, its running child killed: it would serve a folder nobody
reads. So does one whose write-ahead log was deleted under it: its writes since
the last checkpoint live only in that deleted file, which its connection copies
back into the database as it closes, and every new opener is refused until then.

Another process holding the database's write lock (an open `BEGIN IMMEDIATE`)
stops nothing: the supervisor's writes, its sample relay's and the child's wait
it out with growing pauses (`storage.lock_waits`), the file
`drainboard.db.locked` says the wait while it lasts (the System page shows it),
and once it ends the running job gets a `database_locked` event saying how long. A worker started on someone's behalf (`ensure_supervisor`: the
dashboard, `jobs submit --wait`) also ends once idle, that is, for
`LAUNCHED_IDLE_EXIT` seconds no job was queued or running and no dashboard
page was open (`Config.dashboard_heartbeat`), and says so in its log. Its fork
server goes with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

from jobs.backends import backend_for
from jobs.cgroups import CgroupError, JobCgroup, create_job_cgroup, job_cgroup_name, sweep_job_cgroups
from jobs.child import ENV_CGROUP_USAGE
from jobs.ending import RunningChild, keep_logs_only, record_exit
from jobs.forkserver import ForkedChild, ForkServer
from jobs.guard import GuardLimits, Meminfo, MemoryGuard, configured_floor, read_meminfo, spec_limits
from jobs.kinds import load_kinds
from jobs.recovery import recover_orphans
from jobs.liveness import boot_id, pid_alive, process_start
from jobs.outcome import describe_sample
from jobs.presence import HOST, REPO_ROOT, STALE_AFTER, worker_env
from jobs.queue import claim
from jobs.samples import ENV_SAMPLE_FD, SampleRelay, open_sample_pipe
from jobs.child_start import prepare_child
from jobs.spec import JobSpec
from core.diskspace import free_bytes, is_disk_full
from core.errors import DrainboardError
from storage import jobs_table, supervisors_table
from storage.artifacts import new_artifact_path
from storage.config import ENV_RESOLVED, Config
from storage.connections import checkpoint_wal, is_database_full
from storage.events_table import add_event
from storage.lock_waits import LockSpell, LockWait, lock_notice_path
from storage.schema import open_database
from storage.queries import last_sample

HEARTBEAT_INTERVAL = 1.0
"""Seconds between heartbeat writes (the supervisor's row and its job's), and between recovery passes."""
START_METHODS = ("fork", "spawn")
"""How a job child starts: forked by the fork server (`jobs.forkserver`, imports paid once), or a fresh
`python -m jobs.child` (imports paid per job; what the fork server is measured against)."""


class WorkerGone(DrainboardError):
    """This worker cannot go on: its database is gone or replaced."""


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
        self.id = f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.boot_id = boot_id()
        self.lock_wait = LockWait(self.id, lock_notice_path(config.db_path))
        """This worker's waits for another process's lock on the database (its writes wait them out)."""
        self.db = open_database(config.db_path, lock_wait=self.lock_wait)
        self._db_file = _file_identity(config.db_path)
        self._wal = config.db_path.with_name(config.db_path.name + "-wal")
        self._wal_file = _file_identity(self._wal) \
            if self.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal" else None
        self.idle_exit = idle_exit
        self._used_at = time.time()
        """When a job was last in hand or queued, or a dashboard page last seen (wall clock)."""
        self.backend = backend_for(config, self.db, self.id)
        """Where jobs run when not as children here (`jobs.backends`: Ray with `ray_address` set), else None."""
        self.finished: list[int] = []
        """Ids of jobs this supervisor saw to the end, in order."""
        self._running: RunningChild | None = None
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
        supervisors_table.register(self.db, self.id, pid=os.getpid(), host=HOST, boot_id=self.boot_id, now=now)
        self._last_heartbeat = now
        if self.start_method == "fork" and self._fork_server is None and self.backend is None:
            self._fork_server = ForkServer(self.python, worker_env(self.config), str(REPO_ROOT))
        recovered = self.recover_interrupted(now)
        sweep_job_cgroups(supervisor_alive=pid_alive)
        return recovered

    def recover_interrupted(self, now: float) -> list[int]:
        """End `interrupted` every running job (not this supervisor's) whose supervisor is gone or whose
        host restarted (`jobs.recovery`); returns their ids. Right after a lock nobody could write a heartbeat,
        so a job's heartbeat age is no evidence until writes flow again."""
        return recover_orphans(self.db, self.config.data_dir, now, boot=self.boot_id, own_id=self.id,
                               trust_heartbeats=not self.lock_wait.waited_within(STALE_AFTER, now))

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
        """Raise `WorkerGone` once the database file this worker opened is no longer at its path, or its
        write-ahead log was deleted (an open connection keeps its log: another in its place is a new file)."""
        path = self.config.db_path
        if _file_identity(path) != self._db_file:
            where = "its data folder was deleted" if not self.config.data_dir.is_dir() else "the file was removed or replaced"
            raise WorkerGone(f"supervisor {self.id}: the job database {path} is gone ({where}); "
                             f"this worker stops")
        if self._wal_file is not None and _file_identity(self._wal) != self._wal_file:
            raise WorkerGone(f"supervisor {self.id}: the write-ahead log {self._wal} of the job database was deleted while "
                             f"this worker had it open; this worker stops, copying the writes only that log held "
                             f"back into {path} as it closes")

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
        supervisors_table.heartbeat(self.db, self.id, current, now)
        if current is not None:
            jobs_table.heartbeat(self.db, current, now)
        self._say_lock_waits(current)
        if self._disk_full is not None:
            self._disk_full = None
            _say(f"supervisor {self.id}: the database takes writes again")

    def _say_lock_waits(self, job_id: int | None) -> None:
        """Each wait for another process's lock that ended: a line in the worker log, and an event of the job
        in hand."""
        for spell in self.lock_wait.take_ended():
            self._say_lock_wait(spell, job_id)

    def _say_lock_wait(self, spell: LockSpell, job_id: int | None) -> None:
        message = (f"the job database was locked by another process for {spell.seconds:.1f} s "
                   f"(from {time.strftime('%H:%M:%S', time.localtime(spell.since))}); this worker's writes waited "
                   f"and none was lost")
        _say(f"supervisor {self.id}: {message}")
        if job_id is None:
            return
        started = self.db.execute("SELECT started_at FROM jobs WHERE id = ?", [job_id]).fetchone()
        t = max(0.0, spell.since - started[0]) if started and started[0] is not None else 0.0
        add_event(self.db, job_id, "database_locked", message, t=t, data={"since": spell.since, "until": spell.until})

    def _fail_to_start(self, job_id: int, error: str) -> None:
        jobs_table.finish(self.db, job_id, "failed", error=error)
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
        relay = SampleRelay(self.config.db_path, job["id"], read_fd, on_start=guard.begin if guard else None,
                            lock_wait=self.lock_wait)
        if guard:
            guard.start()
        self._running = RunningChild(job["id"], process, log_path, cgroup, relay, guard)
        jobs_table.record_process(self.db, job["id"], process.pid, process_start(process.pid))
        self._heartbeat(time.time())

    def _start_child(self, job_id: int, cgroup: JobCgroup | None, log, sample_fd: int):
        """The job's child process (a Popen, or the fork server's `ForkedChild`)."""
        env = self._child_env(cgroup, sample_fd)
        procs = str(cgroup.procs_file) if cgroup else None
        if self.start_method == "fork":
            if self._fork_server is not None and not self._fork_server.alive():
                _say(f"supervisor {self.id}: the fork server stopped ({self._fork_server.stopped()}); starting another")
                self._fork_server.close()
                self._fork_server = None
            if self._fork_server is None:
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
        """What a job child runs with: this process's environment, pinned to this supervisor's data and roots,
        and the configuration this supervisor resolved, which the child uses as it is (`storage.config.resolved_config`)."""
        env = worker_env(self.config)
        env[ENV_RESOLVED] = self.config.to_json()
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
        self._say_lock_waits(running.job_id)
        missing = record_exit(self.db, self.config, running, code)
        if missing is not None:
            _say(f"supervisor {self.id}: job {running.job_id}: {missing}")
        self._running = None
        self.finished.append(running.job_id)
        self._last_heartbeat = float("-inf")  # say at once that this supervisor is free

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
                keep_logs_only(self.db, self.config.data_dir, running.job_id)
                last = describe_sample(last_sample(self.db, running.job_id), None)
                jobs_table.finish(self.db, running.job_id, "interrupted", error=f"interrupted: the supervisor was stopped; {last}")
            supervisors_table.stopped(self.db, self.id, time.time())
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
        try:  # restored however this ends, a start that fails (a full disk) included
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
        finally:
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


def _say(line: str) -> None:
    """One line to stderr (the worker log), which a full disk may refuse too."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass
