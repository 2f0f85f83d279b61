"""The Ray Jobs backend: each queued job runs as a Ray job on a cluster, SQLite on this machine stays the truth.

With `ray_address` set (`DRAINBOARD_RAY_ADDRESS`), the supervisor hands each claimed
job to `JobSubmissionClient.submit_job`:
- `submission_id` is `drainboard-<job id>-<supervisor token>` (unique across database
  resets), the job's parameters go in `metadata`;
- the entrypoint is `python -m jobs.backends.node ID`, which runs the same job child, told to report
  over `jobs.wire` (records on a pipe of its own, written into the log as tagged lines carrying a
  secret nonce made here for the job) with its spec in the environment;
- `entrypoint_num_gpus` is the spec's GPUs on a CUDA device and `entrypoint_memory` the memory it
  asks for (`memory_limit`, else `memory_budget`), so Ray places it on a node that has both; a
  parallel generate's driver asks no GPU: its child places the `--parallel N` ranks in a placement
  group, on one node or one per node (`jobs.backends.ray_ranks`, told by `ENV_RANKS`);
- the `runtime_env` only sets environment variables: every node has the checkout and
  the environment at the same paths, nothing is installed per job.

A thread follows the job's log (`tail_job_logs`) into `jobs.backends.follow`, which
writes samples, events, stage, progress, outcome and the artifacts sent back into the
same tables and the job's folder; the rest of the log becomes the job's child log. A
stream that breaks (or ends without the job's `exit` record while Ray says it succeeded)
fails the job, naming why, rather than counting it done.
Status comes from `get_job_status`, a cancel is `stop_job`. Artifacts travel over the
log after they are written (no shared folder is needed); one over `jobs.wire.TRANSFER_LIMIT`
fails the job, naming it. A cluster that stops answering ends the job `interrupted`
(host lost) with its last sample, and the queue waits for the cluster to come back.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import sqlite_utils

from jobs.backends.follow import Follower
from jobs.backends.ray_ranks import ENV_RANKS
from jobs.outcome import describe_sample, kill_reason, where
from jobs.spec import JobSpec
from jobs.wire import ENV_NONCE, ENV_REPORT, ENV_SPEC
from storage import jobs_table
from storage.artifacts import new_artifact_path, record_artifact, remove_unrecorded
from storage.config import ENV_RESOLVED, Config
from storage.events_table import add_event
from storage.queries import get_job, last_sample

POLL_INTERVAL = 0.5
"""Seconds between status requests for the running job."""
LOST_AFTER = 5.0
"""Seconds without an answer from the cluster after which a running job counts as lost."""
RETRY_INTERVAL = 5.0
"""Seconds between attempts to reach a cluster that did not answer."""
FOLLOW_GRACE = 15.0
"""Seconds a finished job's log may take to arrive whole before its end is recorded."""
_NOT_FORWARDED = {"DRAINBOARD_DATA", "DRAINBOARD_CONFIG", "DRAINBOARD_RAY_ADDRESS", "DRAINBOARD_ADDRESS",
                  "DRAINBOARD_PORT", "DRAINBOARD_MODEL_ROOTS", "DRAINBOARD_MEMORY_FLOOR", ENV_RESOLVED}
"""Settings of this machine a job's node does not take from its environment (the resolved config is
passed instead)."""
_REPO_ROOT = Path(__file__).resolve().parents[2]


def submission_id(job_id: int, supervisor_id: str) -> str:
    """The Ray submission id of a Drainboard job: its id plus the supervisor's random token."""
    return f"drainboard-{job_id}-{supervisor_id.rsplit(':', 1)[-1]}"


def memory_needed(spec: JobSpec) -> int | None:
    """Bytes the job asks Ray for: its memory limit, else its memory budget (None: no memory asked)."""
    return spec.memory_limit or spec.memory_budget


def job_environment(job: dict, config: Config, nonce: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables of the job's runtime_env: the repository importable (before the node's own
    PYTHONPATH, which Ray expands in), `config` as this
    supervisor resolved it (its model roots and floor; the child reads no config file on the node), the
    report channel, the job's nonce and spec, and this process's other DRAINBOARD_ settings."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k.startswith("DRAINBOARD_") and k not in _NOT_FORWARDED}
    env.update({
        "PYTHONPATH": f"{_REPO_ROOT}{os.pathsep}${{PYTHONPATH}}",  # Ray puts the node's own after it
        ENV_RESOLVED: _unexpanded(config.to_json()),
        ENV_REPORT: "wire",
        ENV_NONCE: nonce,
        ENV_SPEC: _unexpanded(json.dumps(job["spec"])),
        "PYTHONUNBUFFERED": "1",
    })
    return env


def _unexpanded(text: str) -> str:
    """JSON that reaches the node as written: Ray expands `$NAME` and `${NAME}` in every runtime_env value (a prompt
    "at $HOME" arrived as "at /root"), and a `$` can only stand inside a JSON string, where `\\u0024` reads back as
    one."""
    return text.replace("$", "\\u0024")


def submission(job: dict, config: Config, supervisor_id: str, nonce: str, python: str = sys.executable) -> dict:
    """The keyword arguments of `submit_job` for `job` (a `get_job` row) whose tagged lines carry `nonce`."""
    spec = JobSpec.from_dict(job["spec"])
    ranks = spec.job_kind.ranks(spec)
    cuda = spec.device.startswith("cuda")
    # Several ranks: their placement group holds a GPU (or CPU) each (`ray_ranks`); the driver asks none.
    resources = {"entrypoint_num_gpus": spec.gpus if cuda and ranks == 1 else 0}
    if memory_needed(spec):
        resources["entrypoint_memory"] = memory_needed(spec)
    env = job_environment(job, config, nonce)
    if ranks > 1:
        env[ENV_RANKS] = "1"
    return {
        "entrypoint": f"{shlex.quote(python)} -m jobs.backends.node {job['id']}",
        "submission_id": submission_id(job["id"], supervisor_id),
        "metadata": {"drainboard_job": str(job["id"]), "drainboard_supervisor": supervisor_id, "kind": spec.kind,
                     "model": spec.model, "spec": json.dumps(job["spec"])},
        "runtime_env": {"env_vars": env},
        **resources,
    }


@dataclass
class _RayRun:
    job_id: int
    submission_id: str
    log_path: Path
    follower: Follower
    thread: threading.Thread | None = None
    follow_error: BaseException | None = None
    stop_sent: bool = False
    last_answer: float = field(default_factory=time.time)
    next_poll: float = 0.0


class RayJobsBackend:
    """Runs the supervisor's jobs on the Ray cluster at `config.ray_address`, one at a time."""

    name = "ray"

    def __init__(self, config: Config, db: sqlite_utils.Database, supervisor_id: str):
        from ray.job_submission import JobStatus

        self.config, self.db, self.supervisor_id = config, db, supervisor_id
        self._status = JobStatus
        self._client = None
        self._next_try = 0.0
        self._unreachable: str | None = None
        self._run: _RayRun | None = None

    def _connect(self, now: float):
        """The client, made again after the cluster stopped answering (at most every RETRY_INTERVAL)."""
        if self._client is not None or now < self._next_try:
            return self._client
        from ray.job_submission import JobSubmissionClient

        try:
            self._client = JobSubmissionClient(self.config.ray_address)
        except Exception as e:  # noqa: BLE001 - any failure to reach the cluster means: not now
            self._next_try = now + RETRY_INTERVAL
            if self._unreachable is None:
                _say(f"Ray cluster at {self.config.ray_address} does not answer; jobs stay queued: {e}")
            self._unreachable = str(e)
            return None
        if self._unreachable is not None:
            _say(f"Ray cluster at {self.config.ray_address} answers again")
        self._unreachable = None
        return self._client

    def ready(self, now: float) -> bool:
        return self._connect(now) is not None

    def running_job(self) -> int | None:
        return self._run.job_id if self._run else None

    def start(self, job: dict) -> None:
        log_path = new_artifact_path(self.config.data_dir, job["id"], "child", ".log")
        log_path.touch()
        nonce = secrets.token_hex(16)
        arguments = submission(job, self.config, self.supervisor_id, nonce)
        follower = Follower(self.config.db_path, self.config.data_dir, job["id"], log_path, nonce)
        run = _RayRun(job["id"], arguments["submission_id"], log_path, follower)
        try:
            self._client.submit_job(**arguments)
        except Exception as e:  # noqa: BLE001 - Ray's refusal, in its words, is the job's error
            follower.close()
            record_artifact(self.db, self.config.data_dir, job["id"], log_path)
            jobs_table.finish(self.db, job["id"], "failed", error=f"the Ray cluster refused the job: {e}")
            return
        self._event(job["id"], "ray", f"submitted to Ray as {run.submission_id}",
                    {"submission_id": run.submission_id, **{k: v for k, v in arguments.items() if k.startswith("entrypoint_")}})
        run.thread = threading.Thread(target=self._follow, args=(run,), name=f"drainboard-ray-{job['id']}", daemon=True)
        run.thread.start()
        self._run = run

    def _follow(self, run: _RayRun) -> None:
        """The log of the job, fed to its follower until Ray closes it (the job ended, or the cluster went)."""
        async def pump() -> None:
            async for chunk in self._client.tail_job_logs(run.submission_id):
                run.follower.feed(chunk)

        try:
            asyncio.run(pump())
        except Exception as e:  # noqa: BLE001 - a lost cluster ends the stream; the watcher tells
            run.follow_error = e

    def watch(self, now: float) -> bool:
        run = self._run
        if run is None:
            return False
        if now < run.next_poll:
            return True
        run.next_poll = now + POLL_INTERVAL
        try:
            status = self._client.get_job_status(run.submission_id)
            if not run.stop_sent and self._cancel_requested(run.job_id):
                self._client.stop_job(run.submission_id)
                run.stop_sent = True
        except Exception as e:  # noqa: BLE001 - no answer: lost once it lasts LOST_AFTER
            if now - run.last_answer >= LOST_AFTER:
                self._end_lost(run, e)
            return self._run is not None
        run.last_answer = now
        if status == self._status.PENDING:
            jobs_table.set_stage_unless_set(self.db, run.job_id, "waiting for Ray")
        if not status.is_terminal():
            return True
        self._end(run, status)
        return False

    def _cancel_requested(self, job_id: int) -> bool:
        return bool(self.db.execute("SELECT cancel_requested FROM jobs WHERE id = ?", [job_id]).fetchone()[0])

    def _drain(self, run: _RayRun, timeout: float) -> None:
        """Wait for the rest of the log, then store what the follower holds."""
        if run.thread is not None:
            run.thread.join(timeout)
        run.follower.close()
        self._run = None

    def _end(self, run: _RayRun, status) -> None:
        """Record how a job Ray reports finished ended: its own exit line first, Ray's word otherwise."""
        self._drain(run, FOLLOW_GRACE)
        try:
            info = self._client.get_job_info(run.submission_id)
            message, error_type, driver_code = info.message, info.error_type, info.driver_exit_code
        except Exception as e:  # noqa: BLE001 - the cluster went right after: the status is all there is
            message, error_type, driver_code = f"no details ({e})", None, None
        job = get_job(self.db, run.job_id)
        code = run.follower.exit_code if run.follower.exit_code is not None else driver_code
        last = describe_sample(last_sample(self.db, run.job_id), job["progress_total"])
        signal_name = _signal_of(code)
        broken = _broken_stream(run, status == self._status.SUCCEEDED)
        metrics = {}
        if run.follower.guard is not None:
            outcome = "killed"
            error = (f"memory guard: {run.follower.guard['message']} on its Ray node, "
                     f"{where(run.follower.guard_sample, job['progress_total'])}")
            metrics["memory_guard"] = run.follower.guard["data"]
        elif status == self._status.SUCCEEDED and run.follower.exit_code == 0 and broken is None:
            outcome, error = "succeeded", None
        elif job["cancel_requested"]:
            outcome, error = "cancelled", f"cancelled while running (Ray stop_job, {status.value})"
        elif status == self._status.STOPPED:
            outcome, error = "killed", f"job stopped by Ray: {message}; {last}"
        elif error_type == "JOB_SUPERVISOR_ACTOR_DIED":
            outcome, error = "interrupted", f"host lost: Ray says {message}; {last}"
        elif signal_name is not None:
            outcome, error = "killed", f"{kill_reason(signal_name, limit=None, oom_kills=None)} on its Ray node; {last}"
        elif broken is not None:
            outcome, error = "failed", f"{broken}; Ray says the job {status.value}; {last}"
        elif run.follower.exit_code is not None:
            outcome, error = "failed", job["error"] or f"the job process exited with code {code}"
        else:
            outcome, error = "failed", f"job failed under Ray ({error_type}): {message}; {last}"
        self._close_job(run, outcome, error, exit_code=code, signal=signal_name, metrics=metrics)

    def _end_lost(self, run: _RayRun, cause: BaseException) -> None:
        """The cluster stopped answering mid-job: the job is lost with its host; the queue waits for it."""
        self._drain(run, 1.0)
        self._client = None
        self._next_try = time.time() + RETRY_INTERVAL
        job = get_job(self.db, run.job_id)
        last = describe_sample(last_sample(self.db, run.job_id), job["progress_total"])
        self._close_job(run, "interrupted", f"host lost: the Ray cluster at {self.config.ray_address} stopped "
                                            f"answering for {LOST_AFTER:.0f} s while the job ran ({cause}); {last}")

    def _close_job(self, run: _RayRun, status: str, error: str | None, *, metrics: dict | None = None,
                   **fields) -> None:
        record_artifact(self.db, self.config.data_dir, run.job_id, run.log_path)
        if status != "succeeded":
            remove_unrecorded(self.db, self.config.data_dir, run.job_id, keep=(run.log_path.name,))
        metrics = {**(metrics or {}), "ray_submission_id": run.submission_id}
        if run.follower.started:
            metrics["ray_host"] = run.follower.started["host"]
        if run.follower.error is not None:
            error = f"{error or 'the job ended'}; its samples could not all be stored: {run.follower.error}"
        jobs_table.finish(self.db, run.job_id, status, error=error, metrics=metrics, **fields)

    def _event(self, job_id: int, kind: str, message: str, data: dict) -> None:
        add_event(self.db, job_id, kind, message, data=data)

    def stop(self) -> None:
        run = self._run
        if run is None:
            return
        try:
            self._client.stop_job(run.submission_id)
        except Exception as e:  # noqa: BLE001 - the job may be gone with the cluster
            _say(f"could not stop Ray job {run.submission_id}: {e}")
        self._drain(run, 1.0)
        last = describe_sample(last_sample(self.db, run.job_id), None)
        self._close_job(run, "interrupted", f"interrupted: the supervisor was stopped; {last}")


def _broken_stream(run: _RayRun, succeeded: bool) -> str | None:
    """Why the job's log did not arrive whole, or None: the stream failed, or it ended without the relay's
    `exit` record though Ray says the job succeeded (the record is the last line the relay writes)."""
    if run.follow_error is not None:
        return f"the job's log stream from Ray broke ({type(run.follow_error).__name__}: {run.follow_error})"
    if succeeded and run.follower.exit_code is None:
        return "the job's log from Ray ended before its exit record: the stream was cut"
    return None


def _signal_of(code: int | None) -> str | None:
    """The signal that ended a child, from its exit code as Ray reports it (negative, or 128 + n from a shell)."""
    import signal

    if code is None:
        return None
    number = -code if code < 0 else code - 128 if code > 128 else None
    try:
        return signal.Signals(number).name if number else None
    except ValueError:
        return None


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
