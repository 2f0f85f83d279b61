"""Fit the generate forecast's working-set terms (`models.forecast.CPU_TERMS`) on measured runs, and check
them on others (not a test).

    python bench/fit_generate_forecast.py --fit ROOT=RUN.json ... --check ROOT=RUN.json ...

Each RUN.json is what `bench/bench_generate.py --json` wrote for the model at ROOT. Per stage the
measured peak above `prepare`, less what the forecast knows exactly (weights resident, outputs carried),
is the working set; `fixed + per_unit * driver` is fitted to it by least squares over the --fit runs
(per_unit kept >= 0), then every --check run is forecast with the fitted terms and compared per stage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _runs(items: list[str]):
    from machine.device import probe_device
    from machine.offload import OffloadSettings
    from models.forecast import forecast_generate
    from models.params import GenerateParams

    for item in items:
        root, _, path = item.partition("=")
        data = json.loads(Path(path).read_text())
        result = data["result"]
        params = GenerateParams(prompt=data.get("prompt", "a red fox running through fresh snow at dawn"),
                                frames=result["frames"], height=result["height"], width=result["width"],
                                steps=data.get("steps", 3), audio=result["audio"])
        forecast = forecast_generate(root, params, device_info=probe_device("cpu"), settings=OffloadSettings(),
                                     sequential_components=result["sequential_components"])
        base = result["stage_peaks"]["prepare"]
        measured = {s.stage: max(result["stage_peaks"].get(s.stage, 0) - base, 0) for s in forecast.stages}
        yield item, forecast, measured


def _fit_stages(mf, items: list[str]) -> float:
    """Fit each stage's terms in run order (a stage's known part depends on the earlier stages' terms);
    returns the largest relative error over the fit runs."""
    for stage in list(mf.CPU_TERMS):
        xy = []
        for _, forecast, measured in _runs(items):
            s = forecast.stage(stage)
            xy.append((s.driver, measured[stage] - (s.total_bytes - s.activation_bytes)))
        n = len(xy)
        mx, my = sum(x for x, _ in xy) / n, sum(y for _, y in xy) / n
        sxx = sum((x - mx) ** 2 for x, _ in xy)
        slope = max(sum((x - mx) * (y - my) for x, y in xy) / sxx, 0.0) if sxx else 0.0
        fixed = max(my - slope * mx, 0.0)
        mf.CPU_TERMS[stage] = replace(mf.CPU_TERMS[stage], fixed=int(fixed), per_unit=round(slope, 4))
    return max(abs(s.total_bytes / measured[s.stage] - 1) for _, f, measured in _runs(items) for s in f.stages)


def main() -> int:
    import models.forecast as mf

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", nargs="+", required=True, metavar="ROOT=RUN.json")
    parser.add_argument("--check", nargs="*", default=[], metavar="ROOT=RUN.json")
    args = parser.parse_args()
    best = None
    for retained in [i / 20 for i in range(21)]:
        mf.CPU_RETAINED = retained
        error = _fit_stages(mf, args.fit)
        if best is None or error < best[0]:
            best = (error, retained, dict(mf.CPU_TERMS))
    _, mf.CPU_RETAINED, terms = best
    mf.CPU_TERMS.update(terms)
    print(f"CPU_RETAINED = {mf.CPU_RETAINED}")
    for stage, term in terms.items():
        print(f'    "{stage}": StageTerm({term.fixed}, {term.per_unit}),')
    print(f"{'run':<40}{'stage':<18}{'predicted MiB':>14}{'measured MiB':>14}{'ratio':>7}")
    for label, items in (("fit", args.fit), ("check", args.check)):
        for item, forecast, measured in _runs(items):
            for s in forecast.stages:
                m = measured[s.stage]
                print(f"{label + ' ' + Path(item.partition('=')[2]).stem:<40}{s.stage:<18}"
                      f"{s.total_bytes / 2**20:14.1f}{m / 2**20:14.1f}{s.total_bytes / m if m else float('nan'):7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
