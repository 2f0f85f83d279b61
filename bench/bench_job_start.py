"""What starting a job costs beyond its own work, a fresh `python -m jobs.child` per job against the fork server.

    python bench/bench_job_start.py [--jobs 5] [--tensors 12] [--json]

Queues the same small load job (a one-shard checkpoint of `--tensors` tensors) `--jobs`
times under each start method, alternating (so a noisy neighbour does not
land on one side only), in one supervisor per method started beforehand (its
fork server has finished importing before the first job). For each job:
overhead = (finished_at - started_at) - the job's own work (the sum of its
stages, from its stage_end events), and the VmRSS of its first sample (the
clean baseline a job starts from). Prints medians and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from jobs.queue import submit  # noqa: E402
from jobs.supervisor import Supervisor  # noqa: E402
from storage.config import load_config  # noqa: E402
from storage.schema import open_database  # noqa: E402
from storage.queries import events, get_job  # noqa: E402
from storage.schema import FINAL_STATUSES  # noqa: E402


KEYS = ("wall", "work", "overhead", "first_vm_rss", "first_rss_anon", "first_rss_file")


def run_job(supervisor: Supervisor, db, raw: dict, config) -> dict:
    job_id = submit(db, raw, config)
    while get_job(db, job_id)["status"] not in FINAL_STATUSES:
        supervisor.tick()
        time.sleep(0.01)
    job = get_job(db, job_id)
    if job["status"] != "succeeded":
        raise SystemExit(f"job {job_id} {job['status']}: {job['error']}")
    work = sum(e["data"]["seconds"] for e in events(db, job_id) if e["kind"] == "stage_end")
    first = db.execute("SELECT vm_rss, rss_anon, rss_file FROM samples WHERE job_id = ? ORDER BY seq LIMIT 1",
                       [job_id]).fetchone()
    return {"wall": job["finished_at"] - job["started_at"], "work": work,
            "overhead": job["finished_at"] - job["started_at"] - work,
            "first_vm_rss": first[0], "first_rss_anon": first[1], "first_rss_file": first[2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5, help="jobs per start method")
    parser.add_argument("--tensors", type=int, default=12,
                        help="64 x 64 tensors in the checkpoint (thousands make the job's garbage collector run)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        model = data / "models" / "small"
        (model / "transformer").mkdir(parents=True)
        (model / "model_index.json").write_text(json.dumps({"transformer": ["x", "Unknown"]}))
        (model / "transformer" / "config.json").write_text(json.dumps({"_class_name": "UnknownForBench"}))
        save_file({f"blocks.{i}.weight": torch.randn(64, 64) for i in range(args.tensors)},
                  str(model / "transformer" / "model.safetensors"))
        os.environ.update(DRAINBOARD_DATA=str(data))
        os.environ.pop("DRAINBOARD_MODEL_ROOTS", None)
        os.environ.pop("DRAINBOARD_CONFIG", None)
        config = load_config()
        db = open_database(config.db_path)
        raw = {"kind": "load", "model": str(model), "component": "transformer"}
        supervisors = {method: Supervisor(config, start_method=method) for method in ("spawn", "fork")}
        for supervisor in supervisors.values():
            supervisor.start()
            run_job(supervisor, db, raw, config)  # warm-up: the fork server's imports, the page cache
        results: dict[str, list[dict]] = {method: [] for method in supervisors}
        for _ in range(args.jobs):
            for method, supervisor in supervisors.items():
                results[method].append(run_job(supervisor, db, raw, config))
        for supervisor in supervisors.values():
            supervisor.stop()
    summary = {
        method: {key: statistics.median(r[key] for r in runs) for key in KEYS}
        for method, runs in results.items()
    }
    summary["overhead_ratio_fork_over_spawn"] = summary["fork"]["overhead"] / summary["spawn"]["overhead"]
    for key in ("first_vm_rss", "first_rss_anon", "first_rss_file"):
        summary[f"{key}_delta_mib"] = (summary["fork"][key] - summary["spawn"][key]) / 2**20
    if args.json:
        print(json.dumps({"jobs": args.jobs, "summary": summary, "runs": results}, indent=2))
        return
    print(f"{'start':6} {'wall s':>8} {'work s':>8} {'overhead s':>11} {'VmRSS':>8} {'RssAnon':>8} {'RssFile':>8}"
          f"   (medians of {args.jobs}; memory: MiB at the first sample)")
    for method in ("spawn", "fork"):
        m = summary[method]
        print(f"{method:6} {m['wall']:8.2f} {m['work']:8.2f} {m['overhead']:11.2f} {m['first_vm_rss'] / 2**20:8.1f} "
              f"{m['first_rss_anon'] / 2**20:8.1f} {m['first_rss_file'] / 2**20:8.1f}")
    print(f"overhead fork / spawn: {summary['overhead_ratio_fork_over_spawn']:.3f}; first sample, fork - spawn: "
          f"VmRSS {summary['first_vm_rss_delta_mib']:+.1f} MiB, RssAnon {summary['first_rss_anon_delta_mib']:+.1f} MiB, "
          f"RssFile {summary['first_rss_file_delta_mib']:+.1f} MiB")


if __name__ == "__main__":
    main()
