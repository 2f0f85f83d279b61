"""`python -m jobs`: submit, list, show, cancel and retry jobs, and run the worker.

Each command calls one library function. With `--json` exactly one JSON object
goes to stdout; logs and progress go to stderr. Failures print
`{"ok": false, "error": ..., "errors": [...]}` with exit code 2 for bad input
and 1 for anything unexpected.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from jobs.queue import cancel, retry, submit
from jobs.spec import JobSpecError
from loader.errors import DrainboardError, report_error
from storage.artifacts import job_dir
from storage.config import Config, load_config
from storage.connections import connect
from storage.queries import artifacts, get_job, last_sample, list_jobs
from storage.schema import FINAL_STATUSES

EPILOG = """examples:
  python -m jobs submit load --model data/models/demo --component transformer --mode drain --wait --json
  python -m jobs submit load --model data/models/demo --memory-limit 700MB
  python -m jobs submit generate --model data/models/demo --prompt "a red fox" --frames 17 --steps 8
  python -m jobs list --status failed
  python -m jobs show 12 --json
  python -m jobs cancel 12
  python -m jobs worker --once
"""


def job_document(job: dict, db, config: Config) -> dict[str, Any]:
    """The JSON shape of one job: status, error, metrics (DESIGN.md's names), artifacts with paths."""
    folder = job_dir(config.data_dir, job["id"])
    return {
        "id": job["id"],
        "kind": job["kind"],
        "status": job["status"],
        "error": job["error"],
        "metrics": job["metrics"],
        "spec": job["spec"],
        "stage": job["stage"],
        "progress": {"done": job["progress_done"], "total": job["progress_total"]},
        "exit_code": job["exit_code"],
        "signal": job["signal"],
        "created_at": job["created_at"],
        "started_at": job["started_at"],
        "finished_at": job["finished_at"],
        "retry_of": job["retry_of"],
        "last_sample": last_sample(db, job["id"]),
        "artifacts": [
            {"name": a["name"], "path": str(folder / a["name"]), "size": a["size"], "media_type": a["media_type"]}
            for a in artifacts(db, job["id"])
        ],
    }


def _add_common_submit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="checkpoint file or folder under a model root")
    parser.add_argument("--component", help="component folder of a diffusers layout, e.g. transformer")
    parser.add_argument("--mode", default="stream", help="placement mode: stream (default), drain or retain")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default cpu)")
    parser.add_argument("--dtype", help="float32, bfloat16 or float16 (default: the checkpoint's)")
    parser.add_argument("--sample-every", default=1, help="record a memory sample every N tensors (default 1)")
    parser.add_argument("--memory-limit", help="memory cgroup limit for the job, such as 700MB or 4GiB")
    parser.add_argument("--gpus", default=1, help="number of GPUs (default 1)")
    parser.add_argument("--offload", action="append", default=[], metavar="FLAG=on|off",
                        help="set an offload flag, e.g. --offload dit_cpu_offload=off (repeatable)")
    parser.add_argument("--wait", action="store_true", help="wait until the job ends (starts a worker if none runs)")
    parser.add_argument("--json", action="store_true", help="print the job as one JSON object")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jobs", description="Queue and run Drainboard jobs (data folder: DRAINBOARD_DATA).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    submit_parser = commands.add_parser("submit", help="queue a job", epilog=EPILOG,
                                        formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = submit_parser.add_subparsers(dest="kind", required=True)
    load = kinds.add_parser("load", help="load a checkpoint and record memory per tensor",
                            epilog="example: python -m jobs submit load --model data/models/demo --mode drain --wait")
    _add_common_submit(load)
    generate = kinds.add_parser("generate", help="generate a video with the reference pipeline",
                                epilog='example: python -m jobs submit generate --model data/models/demo --prompt "a fox"')
    _add_common_submit(generate)
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--negative-prompt")
    for name in ("frames", "height", "width", "steps", "seed", "fps"):
        generate.add_argument(f"--{name}")
    generate.add_argument("--guidance-scale")
    generate.add_argument("--no-audio", action="store_true", help="skip the audio track")

    listing = commands.add_parser("list", help="list jobs, newest first", epilog="example: python -m jobs list --status failed")
    listing.add_argument("--status", action="append", help="only this status (repeatable)")
    listing.add_argument("--kind")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--json", action="store_true")
    show = commands.add_parser("show", help="one job: status, error, metrics, artifacts", epilog="example: python -m jobs show 3 --json")
    show.add_argument("id", type=int)
    show.add_argument("--json", action="store_true")
    for name, text in (("cancel", "cancel a queued or running job"), ("retry", "queue a finished job again")):
        sub = commands.add_parser(name, help=text, epilog=f"example: python -m jobs {name} 3")
        sub.add_argument("id", type=int)
        sub.add_argument("--json", action="store_true")
    worker = commands.add_parser("worker", help="run queued jobs one at a time", epilog="example: python -m jobs worker --once")
    worker.add_argument("--once", action="store_true", help="run at most one job, then exit")
    worker.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL on cancel")
    return parser


def _parse_offload(values: list[str]) -> dict[str, bool]:
    flags = {}
    for item in values:
        name, _, value = item.partition("=")
        if value not in ("on", "off", "true", "false"):
            raise JobSpecError("offload", f"expected FLAG=on or FLAG=off, got {item!r}")
        flags[name] = value in ("on", "true")
    return flags


def _raw_spec(args: argparse.Namespace) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "kind": args.kind, "model": args.model, "component": args.component, "mode": args.mode,
        "device": args.device, "dtype": args.dtype, "sample_every": args.sample_every,
        "memory_limit": args.memory_limit, "gpus": args.gpus, "offload": _parse_offload(args.offload),
    }
    if args.kind == "generate":
        params: dict[str, Any] = {"prompt": args.prompt, "audio": not args.no_audio}
        for name in ("negative_prompt", "frames", "height", "width", "steps", "seed", "fps", "guidance_scale"):
            if getattr(args, name) is not None:
                params[name] = getattr(args, name)
        raw["generate"] = params
    return raw


def _wait(db, job_id: int) -> dict:
    from jobs.supervisor import ensure_supervisor

    status = ensure_supervisor(load_config())
    if not status["alive"]:
        print("warning: no worker is running and none could be started; see worker.log", file=sys.stderr)
    shown = None
    while True:
        job = get_job(db, job_id)
        line = f"job {job_id}: {job['status']} {job['stage'] or ''} {job['progress_done'] or ''}/{job['progress_total'] or ''}"
        if line != shown:
            print(line, file=sys.stderr)
            shown = line
        if job["status"] in FINAL_STATUSES:
            return job
        time.sleep(0.25)


def _print_job(document: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(document))
        return
    print(f"job {document['id']} ({document['kind']}): {document['status']}")
    if document["error"]:
        print(f"  error: {document['error']}")
    for key, value in sorted((document["metrics"] or {}).items()):
        print(f"  {key}: {value}")
    for artifact in document["artifacts"]:
        print(f"  artifact: {artifact['path']} ({artifact['media_type']}, {artifact['size']} bytes)")


def run_command(args: argparse.Namespace) -> int:
    config = load_config()
    if args.command == "worker":
        from jobs.supervisor import Supervisor

        Supervisor(config, grace=args.grace).run(once=args.once)
        return 0
    db = connect(config.db_path)
    if args.command == "submit":
        job_id = submit(db, _raw_spec(args), config)
        job = _wait(db, job_id) if args.wait else get_job(db, job_id)
        _print_job(job_document(job, db, config), args.json)
        return 0 if job["status"] in ("queued", "succeeded") else 1
    if args.command == "list":
        jobs = list_jobs(db, status=args.status, kind=args.kind, limit=args.limit)
        if args.json:
            print(json.dumps({"jobs": [job_document(j, db, config) for j in jobs]}))
        for job in [] if args.json else jobs:
            model = (job["spec"] or {}).get("model", "")
            print(f"{job['id']:>5}  {job['kind']:<9} {job['status']:<11} {model}  {job['error'] or ''}")
        return 0
    if args.command == "cancel":
        cancel(db, args.id)
    job_id = retry(db, args.id) if args.command == "retry" else args.id
    job = get_job(db, job_id)
    if job is None:
        raise JobSpecError("id", f"job {job_id} does not exist")
    _print_job(job_document(job, db, config), args.json)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run_command(args)
    except DrainboardError as e:
        return report_error(e, as_json=getattr(args, "json", False))
    except Exception as e:
        if getattr(args, "json", False):
            print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}", "errors": []}))
        print(f"unexpected error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
