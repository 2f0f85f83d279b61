"""Entry point of the process that runs one job: `python -m jobs.child JOB_ID`.

A fresh process per job gives every job the same memory baseline and keeps an
OOM kill away from the supervisor and the dashboard. Exit codes: 0 done,
1 the job raised (its message is stored in the `error` column of `jobs`), 2 invalid spec,
3 the disk was full (the message is stored if the database still takes it).
SIGTERM (a cancel, a memory guard's stop, or a signal from outside) raises
`JobCancelled` so samples still get flushed; the child then dies of that SIGTERM,
so its parent sees the signal, not an exit code of a job that failed.
Under a supervisor, samples go to its pipe (`DRAINBOARD_SAMPLE_FD`, see `jobs.samples`).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path

from jobs.reporting import DatabaseReporter, Reporter
from jobs.samples import ENV_SAMPLE_FD
from jobs.wire import ENV_REPORT
from core.command_line import quiet_import_chatter
from core.diskspace import free_bytes, is_disk_full
from core.echo import echo_name
from core.errors import DiskFullError
from loader.process import configure_process
from storage.config import Config, resolved_config
from storage.connections import is_database_full

EXIT_DONE, EXIT_FAILED, EXIT_INVALID_SPEC, EXIT_DISK_FULL = 0, 1, 2, 3
STOPPED = -signal.SIGTERM
"""What `run_job` returns for a job stopped by SIGTERM: `main` then dies of the signal."""

TRACEBACK_LINE_LIMIT = 4000
"""Characters of one line of a failed job's traceback in its log; a longer line is cut (`core.echo`)."""

ENV_CGROUP_USAGE = "DRAINBOARD_CGROUP_USAGE_FILE"
"""Set by the supervisor when the job runs in a memory cgroup: the usage file samples read."""


class JobCancelled(BaseException):
    """Raised in the job's thread when the supervisor asks it to stop (SIGTERM)."""


def _on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second SIGTERM (Ray sends one to the relay and one here) must not cut the clean-up
    raise JobCancelled("cancelled (SIGTERM)")


def run_job(job_id: int) -> int:
    """Run job `job_id`, reporting to the configured database or, under the Ray backend, over its record
    pipe (`jobs.wire`, with a scratch data folder whose artifacts are sent back); returns the exit code."""
    config = resolved_config()  # the worker's, handed down: never the drainboard.toml of this working directory
    reporter, data_dir = open_reporter(job_id, config)
    try:
        return _run(job_id, reporter, data_dir, config)
    finally:
        reporter.close()
        if data_dir != config.data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)


def open_reporter(job_id: int, config: Config) -> tuple[Reporter, Path]:
    """The child's reporter and the data folder its artifacts are written in."""
    if os.environ.get(ENV_REPORT) == "wire":
        from machine.lifetime import die_with_parent
        from jobs.wire import ENV_RECORD_FD, LineWriter, WireReporter

        die_with_parent()  # the relay on the node (`jobs.backends.node`): a lost node must not leave the job running
        writer = LineWriter(int(os.environ.pop(ENV_RECORD_FD)))
        return WireReporter(job_id, writer), Path(tempfile.mkdtemp(prefix=f"drainboard-job{job_id}-"))
    return DatabaseReporter(job_id, config.db_path, config.data_dir), config.data_dir


def _run(job_id: int, reporter: Reporter, data_dir: Path, config: Config) -> int:
    from jobs.context import JobContext
    from jobs.kinds import get_kind
    from jobs.spec import JobSpec
    from machine.memory import MemoryProbe

    raw = reporter.spec()
    if raw is None:
        print(f"job {job_id} does not exist in {config.db_path}", file=sys.stderr)
        return EXIT_INVALID_SPEC
    try:
        spec = JobSpec.from_dict(raw)
        run = get_kind(spec.kind).run
    except (TypeError, ValueError, KeyError) as e:
        reporter.error(f"invalid spec: {e}", None)
        return EXIT_INVALID_SPEC
    mismatch = spec.roots_mismatch(config.model_roots)
    if mismatch is not None:
        reporter.error(mismatch, None)
        return EXIT_FAILED
    configure_process(spec.device)  # the device's settings, before anything of the job's runs
    signal.signal(signal.SIGTERM, _on_sigterm)
    probe = MemoryProbe(spec.device, cgroup_file=os.environ.get(ENV_CGROUP_USAGE) or None)
    sample_fd = os.environ.get(ENV_SAMPLE_FD)
    ctx = JobContext(job_id, reporter=reporter, data_dir=data_dir, probe=probe, sample_every=spec.sample_every,
                     sample_fd=int(sample_fd) if sample_fd else None, config=config)
    guard = _guard_itself(spec, config, reporter, ctx) if reporter.remote else None
    try:
        metrics = run(spec, ctx)
        ctx.close()  # the last samples land before the job counts as done
        reporter.metrics(metrics or {})
        return EXIT_DONE
    except JobCancelled:
        return STOPPED
    except Exception as e:
        return _fail(reporter, e, config)
    finally:
        if guard is not None:
            guard.stop()
        _close_quietly_if_full(ctx)
        probe.close()


def _guard_itself(spec, config: Config, reporter: Reporter, ctx):
    """The memory guard of a child away from its supervisor (a Ray node): the node's memory, watched here;
    a trip is reported before the child stops itself as the supervisor would stop it. None when no limit applies."""
    from jobs.guard import MemoryGuard, spec_limits

    limits = spec_limits(spec.memory_budget, spec.memory_floor, config)
    if not limits.active:
        return None

    def stop_self(sig: int) -> None:
        if sig == signal.SIGTERM:
            reporter.guard(guard.trip, ctx.seconds())
        os.kill(os.getpid(), sig)

    guard = MemoryGuard(limits, stop_self)
    guard.begin()  # after the imports, as the supervisor's guard begins at the child's first report
    return guard.start()


def _disk_full(e: BaseException) -> bool:
    return isinstance(e, DiskFullError) or is_disk_full(e) or is_database_full(e)


def _fail(reporter: Reporter, e: Exception, config: Config) -> int:
    """Store the error (first: on a full disk the log may refuse the traceback) and pick the exit code."""
    if is_database_full(e):
        message = (f"disk full: cannot write to the database {config.db_path} "
                   f"({free_bytes(config.db_path):,} bytes free): {e}")
    else:
        message = f"{type(e).__name__}: {e}" if not str(e).startswith(type(e).__name__) else str(e)
    reporter.error(*summarize_error(message))
    try:  # the traceback quotes names from files (a tensor's, in a third-party error): a line that holds
        # a character that does not print is quoted, so the log cannot drive a terminal
        for line in traceback.format_exc().splitlines():
            print(echo_name(line, TRACEBACK_LINE_LIMIT), file=sys.stderr)
        sys.stderr.flush()
    except OSError:
        pass
    return EXIT_DISK_FULL if _disk_full(e) else EXIT_FAILED


def summarize_error(message: str) -> tuple[str, str | None]:
    """(one line for lists, the full text or None): "CheckpointError: 24 problems:\n  a\n  b ..." becomes
    "CheckpointError: 24 problems: a (+23 more)" with the whole list kept as the detail."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) <= 1:
        return message, None
    more = f" (+{len(lines) - 2} more)" if len(lines) > 2 else ""
    return f"{lines[0].rstrip(':')}: {lines[1]}{more}", message


def _close_quietly_if_full(ctx) -> None:
    """Close the context; samples that a full disk refuses are lost, and the job already says why."""
    try:
        ctx.close()
    except Exception as e:
        if not _disk_full(e):
            raise

def main(job_id: int) -> int:
    """Run the job and return the exit code, a full disk included (the database may refuse even the first writes);
    a job stopped by SIGTERM ends this process by that signal once everything is flushed. An installed torchao's
    import-time warnings stay out of the job's log (`core.command_line.IMPORT_CHATTER`)."""
    configure_process()
    quiet_import_chatter()
    try:
        code = run_job(job_id)
    except Exception as e:
        if not _disk_full(e):
            raise
        return EXIT_DISK_FULL
    if code == STOPPED:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # delivered at once: this process ends here
    return code


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        print("usage: python -m jobs.child JOB_ID", file=sys.stderr)
        sys.exit(EXIT_INVALID_SPEC)
    sys.exit(main(int(sys.argv[1])))
