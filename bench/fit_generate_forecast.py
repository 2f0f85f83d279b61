"""Fit the generate forecast's working-set terms (`models.forecast.fitted.CPU`) on measured runs, and check
them on others (not a test).

    python bench/fit_generate_forecast.py --fit ROOT=RUN.json ... --check ROOT=RUN.json ...

Each RUN.json is what `bench/bench_generate.py --json` wrote for the model at ROOT. Runs of the same
model and geometry are merged, each stage's lower peak kept (as the test does: on a shared box timing
only ever adds to a peak). Per stage the measured peak above `prepare`, less what the forecast knows
exactly (weights resident, outputs carried, the heap retained from earlier stages), is the working set;
`fixed + per_unit * driver` is fitted to it by least squares over the --fit runs (per_unit kept >= 0),
for each pair of retained shares (`retained`, `retained_weights`) on a grid, keeping the pair
whose largest relative error over the fit runs is least; then every --check run is forecast with the
fitted terms and compared per stage.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from loader.process import configure_process  # noqa: E402

configure_process()  # an entry point: the hub offline, the mmap threshold fixed, as a job child


def _merged(items: list[str]) -> list[tuple[str, str, Any, dict[str, int]]]:
    """(label, root, params, stage -> measured bytes above `prepare`) per model and geometry, the lower
    peak of repeated runs kept."""
    from models.request.params import GenerateParams

    merged: dict[tuple, tuple[str, str, Any, dict[str, int]]] = {}
    for item in items:
        root, _, path = item.partition("=")
        data = json.loads(Path(path).read_text())
        result = data["result"]
        params = GenerateParams(prompt=data.get("prompt", "a red fox running through fresh snow at dawn"),
                                frames=result["frames"], height=result["height"], width=result["width"],
                                steps=data.get("steps", 3), audio=result["audio"])
        base = result["stage_peaks"]["prepare"]
        measured = {stage: max(peak - base, 0) for stage, peak in result["stage_peaks"].items()}
        key = (root, params, result["sequential_components"])
        label = f"{Path(root).name} {params.frames} x {params.width}x{params.height}"
        if key in merged:
            measured = {stage: min(peak, merged[key][3].get(stage, peak)) for stage, peak in measured.items()}
        merged[key] = (label, root, (params, result["sequential_components"]), measured)
    return list(merged.values())


def _runs(runs):
    from machine.device import probe_device
    from machine.offload import OffloadSettings
    from models.forecast import forecast_generate

    cpu = probe_device("cpu")
    for label, root, (params, sequential), measured in runs:
        forecast = forecast_generate(root, params, device_info=cpu, settings=OffloadSettings(),
                                     sequential_components=sequential)
        yield label, forecast, measured


def _fit_stages(fitted, items) -> float:
    """Fit each stage's terms in run order (a stage's known part depends on the earlier stages' terms);
    returns the largest error over the fit runs in units of the test's tolerance (10 %, at least
    `noise_floor`), so that stages of a few MiB, where the machine's noise is absolute, do not
    decide the retained shares."""
    terms = fitted.CPU.terms  # filled in place: the forecast reads `fitted.CPU` on every call
    for stage in [s for s in terms if s not in fitted.CPU.vae_alone]:  # those: bench/bench_vae_encode.py
        xy = []
        for _, forecast, measured in _runs(items):
            s = forecast.stage(stage)
            xy.append((s.driver, measured[stage] - (s.total_bytes - s.activation_bytes)))
        n = len(xy)
        mx, my = sum(x for x, _ in xy) / n, sum(y for _, y in xy) / n
        sxx = sum((x - mx) ** 2 for x, _ in xy)
        slope = max(sum((x - mx) * (y - my) for x, y in xy) / sxx, 0.0) if sxx else 0.0
        fixed = max(my - slope * mx, 0.0)
        terms[stage] = replace(terms[stage], fixed=int(fixed), per_unit=round(slope, 4))
    return max(abs(s.total_bytes - measured[s.stage]) / max(0.10 * measured[s.stage], fitted.CPU.noise_floor)
               for _, f, measured in _runs(items) for s in f.stages)


def main() -> int:
    from models.forecast import fitted, stages

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", nargs="+", required=True, metavar="ROOT=RUN.json")
    parser.add_argument("--check", nargs="*", default=[], metavar="ROOT=RUN.json")
    args = parser.parse_args()
    # Headers and the tokenizer do not change between grid points: read them once.
    stages.weight_bytes = functools.lru_cache(maxsize=None)(stages.weight_bytes)
    stages.count_prompt_tokens = functools.lru_cache(maxsize=None)(stages.count_prompt_tokens)
    fit, check = _merged(args.fit), _merged(args.check)
    best = None
    for retained in [i / 10 for i in range(11)]:
        for retained_weights in [i / 10 for i in range(11)]:
            fitted.CPU = replace(fitted.CPU, retained=retained, retained_weights=retained_weights)
            error = _fit_stages(fitted, fit)
            if best is None or error < best[0]:
                best = (error, retained, retained_weights, dict(fitted.CPU.terms))
    _, retained, retained_weights, terms = best
    fitted.CPU.terms.update(terms)
    fitted.CPU = replace(fitted.CPU, retained=retained, retained_weights=retained_weights)
    print(f"retained={retained},\nretained_weights={retained_weights},")
    for stage, term in terms.items():
        print(f'    "{stage}": StageTerm({term.fixed}, {term.per_unit}),')
    print(f"{'run':<40}{'stage':<18}{'predicted MiB':>14}{'measured MiB':>14}{'ratio':>7}")
    for kind, runs in (("fit", fit), ("check", check)):
        for label, forecast, measured in _runs(runs):
            for s in forecast.stages:
                m = measured[s.stage]
                print(f"{kind + ' ' + label:<40}{s.stage:<18}"
                      f"{s.total_bytes / 2**20:14.1f}{m / 2**20:14.1f}{s.total_bytes / m if m else float('nan'):7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
