"""`python -m jobs`: submit, list, show, cancel, reorder and retry jobs, clear the queue, and run the worker.

Each subcommand is one function calling one library function, run through the
shared `core.command_line.run_cli`: with `--json` exactly one JSON object goes
to stdout (logs and progress to stderr); bad input, usage errors and a full
disk print `{"ok": false, "error": ..., "errors": [...]}` (or one `error:`
line) and exit 2; anything unexpected exits 1.
"""

from __future__ import annotations

import argparse
import functools
import json
import sqlite3
import sys
import time
from typing import Any, Callable

import sqlite_utils

from jobs.documents import job_document, print_job, print_job_table
from jobs.kinds import get_kind, kind_names
from jobs.queue import cancel, clear_queue, move_to_front, retry, submit
from jobs.stage_words import progress_text
from jobs.errors import JobSpecError
from core.command_line import CliParser, DeferredText, dtype_type, run_cli
from machine.offload_option import add_offload_option
from core.dtype_names import dtype_help
from core.diskspace import free_bytes, is_disk_full
from core.errors import DiskFullError
from core.sizes import MAX_SIZE
from loader.process import configure_process
from storage.config import Config, load_config
from storage.connections import is_database_full, refusal_error
from storage.queries import get_job, job_table, list_jobs
from storage.schema import FINAL_STATUSES, JOB_STATUSES, open_database, open_for_reading

LOW_DISK_SPACE = 2**20
"""Free bytes under which an SQLite I/O error counts as a full disk (a WAL database that cannot create its
`-shm` file reports "disk I/O error", not "database or disk is full")."""
NO_WORKER_DEADLINE = 30.0
"""Seconds `--wait` keeps waiting while no worker is alive before it gives up."""

EXAMPLES = """examples:
  python -m jobs submit load --model data/models/demo --component transformer --mode drain --wait --json
  python -m jobs submit load --model data/models/demo --memory-limit 700MB --memory-budget 0.5GiB
  python -m jobs submit generate --model data/models/demo --prompt "a red fox" --frames 141 --steps 8
  python -m jobs submit generate --model data/models/demo --prompt "a red fox" --memory-budget 8GiB --force
  python -m jobs list --status failed
  python -m jobs show 12 --json
  python -m jobs cancel 12
  python -m jobs front 14
  python -m jobs clear
  python -m jobs retry 12
  python -m jobs worker --once
"""

Command = Callable[[argparse.Namespace, Config, sqlite_utils.Database], int]


def main(argv: list[str] | None = None) -> int:
    configure_process()
    return run_cli(build_parser, argv)


def _with_database(run: Command | None = None, *, read_only: bool = False):
    """Give a subcommand the config and an open database (`read_only`: opened for reads only, so it works on
    read-only media); a full disk becomes a DiskFullError (exit 2) saying where and how much is free, any
    other refusal of the database one line naming it and why (also exit 2)."""
    if run is None:
        return functools.partial(_with_database, read_only=read_only)

    @functools.wraps(run)
    def command(args: argparse.Namespace) -> int:
        config = load_config()
        try:
            db = open_for_reading(config.db_path) if read_only else open_database(config.db_path)
            try:
                return run(args, config, db)
            finally:
                db.conn.close()
        except Exception as e:
            if is_database_full(e) or is_disk_full(e) or (
                    isinstance(e, sqlite3.OperationalError) and free_bytes(config.db_path) < LOW_DISK_SPACE):
                raise DiskFullError(f"disk full: cannot write to the database {config.db_path} "
                                    f"({free_bytes(config.db_path):,} bytes free): {e}") from e
            refused = refusal_error(e, config.db_path)
            if refused is not None:
                raise refused from e
            raise

    return command


@_with_database
def _submit(args: argparse.Namespace, config: Config, db: sqlite_utils.Database) -> int:
    from loader.placement.advice import warn_about_mode

    job_id = submit(db, _raw_spec(args), config)
    warn_about_mode(args.mode, args.device)
    planned = (get_job(db, job_id).get("spec") or {}).get("planned")
    if planned and not args.json:
        from models.speed.plan import plan_lines

        for line in plan_lines(planned):
            print(line, file=sys.stderr)
    if args.wait:
        job = _wait(db, config, job_id)
    else:
        _start_worker(config, job_id)
        job = get_job(db, job_id)
    print_job(job_document(job, db, config), as_json=args.json)
    return 0 if job["status"] == "succeeded" or (not args.wait and job["status"] in ("queued", "running")) else 1


def _start_worker(config: Config, job_id: int) -> None:
    """Queued without --wait: the job runs now, as the dashboard and --wait would have it, so start a worker
    when none is alive and say on stderr which one runs it."""
    from jobs.presence import LAUNCHED_IDLE_EXIT, ensure_supervisor

    status = ensure_supervisor(config)
    log = config.data_dir / "worker.log"
    if status.get("launched_pid") and status["alive"]:
        _say(f"job {job_id} queued; started a worker for it (pid {status['pid']}; it exits after "
             f"{LAUNCHED_IDLE_EXIT / 60:g} minutes with nothing to do; log: {log})")
    elif status["alive"]:
        _say(f"job {job_id} queued; the running worker (pid {status['pid']}) takes it in turn")
    else:
        _say(f"job {job_id} queued, but the worker started for it is not running: see {log}, or start one with "
             f"`python -m jobs worker`")


def _recover(config: Config, db: sqlite_utils.Database) -> None:
    """End the jobs of dead supervisors before showing any (`jobs.recovery`), as a starting worker would. `db`
    may be read-only: the database is opened for writing only when there is such a job, and on read-only
    media the jobs are shown as stored."""
    from jobs.liveness import boot_id
    from jobs.recovery import orphans, recover_orphans

    now, boot = time.time(), boot_id()
    if not orphans(db, now, boot=boot):
        return
    try:
        writable = open_database(config.db_path)
    except (sqlite3.Error, OSError):
        return
    try:
        recover_orphans(writable, config.data_dir, now, boot=boot)
    finally:
        writable.conn.close()


@_with_database(read_only=True)
def _list(args: argparse.Namespace, config: Config, db: sqlite_utils.Database) -> int:
    _recover(config, db)
    if args.json:
        jobs = list_jobs(db, status=args.status, kind=args.kind, limit=args.limit)
        print(json.dumps({"jobs": [job_document(j, db, config) for j in jobs]}))
    else:  # only the columns it shows: a spec or metrics JSON can run to megabytes a job
        print_job_table(job_table(db, status=args.status, kind=args.kind, limit=args.limit))
    return 0


@_with_database(read_only=True)
def _show(args: argparse.Namespace, config: Config, db: sqlite_utils.Database) -> int:
    _recover(config, db)
    return _print_existing(db, config, args.id, args.json)


@_with_database
def _cancel(args: argparse.Namespace, config: Config, db: sqlite_utils.Database) -> int:
    cancel(db, args.id)
    return _print_existing(db, config, args.id, args.json)


@_with_database
def _front(args: argparse.Namespace, config: Config, db: sqlite_utils.Database) -> int:
    move_to_front(db, args.id)
    return _print_existing(db, config, args.id, args.json)


@_with_database
def _clear(args: argparse.Namespace, config: Config, db: sqlite_utils.Database) -> int:
    cleared = clear_queue(db)
    if args.json:
        print(json.dumps({"cancelled": cleared}))
    else:
        print(f"cancelled {len(cleared)} queued job(s)" + (f": {', '.join(map(str, cleared))}" if cleared else ""))
    return 0


@_with_database
def _retry(args: argparse.Namespace, config: Config, db: sqlite_utils.Database) -> int:
    return _print_existing(db, config, retry(db, args.id, config), args.json)


@_with_database
def _worker(args: argparse.Namespace, config: Config, db: sqlite_utils.Database) -> int:
    from jobs.supervisor import Supervisor

    Supervisor(config, grace=args.grace, idle_exit=args.exit_when_idle).run(once=args.once)
    return 0


def _print_existing(db: sqlite_utils.Database, config: Config, job_id: int, as_json: bool) -> int:
    job = get_job(db, job_id)
    if job is None:
        raise JobSpecError("id", f"job {job_id} does not exist")
    print_job(job_document(job, db, config), as_json=as_json)
    return 0


def _wait(db: sqlite_utils.Database, config: Config, job_id: int) -> dict:
    """Follow the job on stderr until it ends, starting a worker if none is alive; give up (returning the
    job as it stands) once no worker has been alive for NO_WORKER_DEADLINE seconds."""
    from jobs.presence import ensure_supervisor, supervisor_status

    ensure_supervisor(config)
    shown, alive_at = None, time.monotonic()
    while True:
        job = get_job(db, job_id)
        where = progress_text(job["stage"], job["progress_done"], job["progress_total"])
        line = f"job {job_id}: {job['status']}" + (f": {where}" if where else "")
        if line != shown:
            _say(line)
            shown = line
        if job["status"] in FINAL_STATUSES:
            return job
        if supervisor_status(db)["alive"]:
            alive_at = time.monotonic()
        elif time.monotonic() - alive_at > NO_WORKER_DEADLINE:
            _say(f"error: no worker has been alive for {NO_WORKER_DEADLINE:g} s, so job {job_id} is still "
                 f"{job['status']}; start one with `python -m jobs worker` (see {config.data_dir / 'worker.log'})")
            return job
        time.sleep(0.25)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _raw_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The spec fields as typed, the kind's own from its flags (`JobKind.arguments`): `build_spec` checks them all
    at once, naming each bad field."""
    raw: dict[str, Any] = {
        "kind": args.kind, "model": args.model, "component": args.component, "mode": args.mode,
        "device": args.device, "dtype": args.dtype, "sample_every": args.sample_every,
        "memory_limit": args.memory_limit, "memory_budget": args.memory_budget, "memory_floor": args.memory_floor,
        "gpus": args.gpus, "offload": args.offload, "forced": args.force,
    }
    return raw | get_kind(args.kind).arguments(args)


def _positive_int(text: str) -> int:
    """A count or job id as SQLite holds it; anything else (`10**30`, `²`) is a usage error naming the argument."""
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to {MAX_SIZE}, got {text!r}")
    return int(text)


def build_parser() -> CliParser:
    parser = CliParser(prog="python -m jobs", epilog=EXAMPLES,
                       description="Queue and run Drainboard jobs (data folder: DRAINBOARD_DATA).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_submit(commands)
    listing = _add_command(commands, "list", _list, "list jobs, newest first",
                           "python -m jobs list --status failed --kind load")
    listing.add_argument("--status", action="append", choices=JOB_STATUSES, help="only this status (repeatable)")
    listing.add_argument("--kind", choices=kind_names(), help="only this job kind")
    listing.add_argument("--limit", type=_positive_int, default=50, help="at most N jobs (default 50)")
    for name, run, text in (("show", _show, "one job: status, error, metrics, artifacts"),
                            ("cancel", _cancel, "cancel a queued or running job"),
                            ("front", _front, "move a queued job to the front of the queue"),
                            ("retry", _retry, "queue a finished job again, its spec checked again")):
        command = _add_command(commands, name, run, text, f"python -m jobs {name} 3" + (" --json" * (name == "show")))
        command.add_argument("id", type=_positive_int, help="the job's id (see `python -m jobs list`)")
    _add_command(commands, "clear", _clear, "cancel every queued job (a running one keeps running)",
                 "python -m jobs clear")
    worker = _add_command(commands, "worker", _worker, "run queued jobs one at a time", "python -m jobs worker --once",
                          json_option=False)
    worker.add_argument("--once", action="store_true", help="run at most one job, then exit")
    worker.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL on cancel")
    worker.add_argument("--exit-when-idle", type=float, metavar="SECONDS",
                        help="exit after SECONDS with no job queued or running and no dashboard page open "
                             "(what a worker the dashboard or `submit --wait` starts does, with 600)")
    return parser


def _add_command(commands: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], int],
                 text: str, example: str, *, json_option: bool = True) -> argparse.ArgumentParser:
    command = commands.add_parser(name, help=text, description=text, epilog=f"example:\n  {example}")
    if json_option:
        command.add_argument("--json", action="store_true", help="print one JSON object")
    command.set_defaults(func=run)
    return command


def _add_submit(commands: argparse._SubParsersAction) -> None:
    """`submit KIND`, one per registered kind: the flags every job has, then the kind's own."""
    submit_parser = commands.add_parser("submit", help="queue a job", description="Queue a job.", epilog=EXAMPLES)
    kinds = submit_parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    for name in kind_names():
        kind = get_kind(name)
        command = _add_command(kinds, name, _submit, kind.summary or name,
                               kind.example or f"python -m jobs submit {name} --model data/models/demo")
        _add_spec_options(command)
        kind.add_arguments(command)


def _modes_help() -> str:
    """The placement modes described, read from their registry only when help is printed (it imports torch)."""
    from loader.placement import modes_help

    return modes_help()


def _add_spec_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="checkpoint file or folder under a model root")
    parser.add_argument("--component", help="component of a model folder, e.g. transformer (checked at submit)")
    mode = parser.add_argument("--mode", default="stream", help="placement mode (default: stream): %(modes)s")
    mode.modes = DeferredText(_modes_help)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default cpu; checked at submit)")
    parser.add_argument("--dtype", type=dtype_type, help=f"{dtype_help()} (default: the checkpoint's)")
    parser.add_argument("--sample-every", default=1, metavar="N", help="record a memory sample every N tensors (default 1)")
    parser.add_argument("--memory-limit", metavar="SIZE", help="memory cgroup limit for the job, such as 700MB or 4GiB")
    parser.add_argument("--memory-budget", metavar="SIZE",
                        help="memory guard: stop the job once system in use grew this much over its start, e.g. 0.5GiB")
    parser.add_argument("--memory-floor", metavar="SIZE",
                        help="memory guard: stop the job once MemAvailable falls below this (default: configured)")
    parser.add_argument("--gpus", default=1, metavar="N", help="number of GPUs (default 1)")
    add_offload_option(parser)
    parser.add_argument("--wait", action="store_true",
                        help="wait until the job ends (either way a worker is started if none runs)")
    parser.add_argument("--force", action="store_true",
                        help="queue it even when the forecast says it cannot fit (the job records it was forced)")
