"""A job's measured stage peaks against the forecast of the same request, stage by stage (not a test).

    python -m models forecast MODEL ... --json > forecast.json
    python -m models generate MODEL ... --json > result.json     # the same arguments
    python bench/compare_forecast.py forecast.json result.json

The forecast's stage sums are above the process; a job's stage peaks (VmRSS + CUDA allocated) include it. So
the predicted figure is the stage's sum plus the forecast's process term plus the job's own `prepare` peak
(the process when the first weight is read), as bench/check_forecast_cuda.py adds the measured start-up.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MiB = 2**20


def compare(forecast: dict, result: dict) -> list[dict]:
    """One row per stage both name: predicted and measured bytes and their ratio."""
    start = result["stage_peaks"]["prepare"]
    rows = []
    for stage in forecast["stages"]:
        measured = result["stage_peaks"].get(stage["stage"])
        if measured is None:
            continue
        predicted = stage["sum_bytes"] + forecast["process_host_bytes"] + start
        rows.append({"stage": stage["stage"], "predicted": predicted, "measured": measured,
                     "ratio": predicted / measured})
    return rows


def worst_line(rows: list[dict], label=lambda row: row["stage"]) -> str:
    """The row furthest from its measurement, and how many are within 10 %."""
    worst = max(rows, key=lambda r: abs(r["ratio"] - 1))
    return (f"worst: {label(worst)} {worst['ratio']:.3f}; within 10 %: "
            f"{sum(abs(r['ratio'] - 1) <= 0.10 for r in rows)} of {len(rows)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("forecast", type=Path, help="`python -m models forecast ... --json`")
    parser.add_argument("result", type=Path, help="`python -m models generate ... --json`, the same request")
    args = parser.parse_args(argv)
    rows = compare(json.loads(args.forecast.read_text()), json.loads(args.result.read_text()))
    if not rows:
        print(f"{args.forecast} and {args.result} share no stage", file=sys.stderr)
        return 1
    print(f"{'stage':<28}{'predicted MiB':>15}{'measured MiB':>14}{'ratio':>8}")
    for r in rows:
        print(f"{r['stage']:<28}{r['predicted'] / MiB:15.1f}{r['measured'] / MiB:14.1f}{r['ratio']:8.3f}")
    print(worst_line(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
