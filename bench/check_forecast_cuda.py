"""The generate forecast on CUDA against a measured real-size run, stage by stage (not a test).

    python bench/check_forecast_cuda.py [SUMMARY.json ...] [--root DIR]
    python bench/check_forecast_cuda.py tests/models/h200_runs/t2va_offload.json   # the offload runs only

A measured file is the summary `bench/bench_h3_generate.py` writes (one H200, the `h3` profile at real
size), or a trimmed copy of one: the default is every file in tests/models/h200_runs/, the stage peaks of
the runs docs/benchmarks.md reports, kept for this check and its slow test. The forecast needs only
headers and configs, so this writes the `h3` profile with every shard's data left as a hole (a sparse
file: 135 GB apparent, under 1 MB on disk, ten seconds) and forecasts each of our measured runs on an
H200's DeviceInfo. The measured sum is peak VmRSS plus torch's reserved device memory; the CUDA context is
outside torch's figure, so the forecast's context term is left out of the comparison (it is in the job's
predicted peak).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GiB = 2**30
H200_STARTUP = 960 * 2**20
"""The process at the end of `prepare` on the H200 the measured runs came from (docs/benchmarks.md): a job
learns it from its machine's history (`models.forecast.process_size`); this check has one machine's runs only."""
H200_BYTES = 150_012_739_584
"""torch.cuda.get_device_properties(0).total_memory on the H200 host."""


def write_sparse_h3(root: Path, profile: str = "h3", components: list[str] | None = None) -> None:
    """The profile's folders and ref2va's `transformer_ref` (or only `components`) with each safetensors file's
    header written and its data a hole."""
    import models.synth.writer as synth
    from models.synth.profiles import get_profile
    from loader.safetensors_file import header_bytes

    def headers_only(path, shard, chunks, on_bytes=None) -> None:
        head = header_bytes(shard)
        size = sum(spec.nbytes for spec in shard)
        with open(path, "wb") as f:
            f.write(head)
            f.truncate(len(head) + size)
        if on_bytes is not None:
            on_bytes(size)

    spec = with_reference_dit(get_profile(profile))
    components = list(spec.components) if components is None else components
    write, space = synth.write_safetensors, synth.require_space
    synth.write_safetensors = headers_only
    synth.require_space = lambda *args, **kwargs: None  # holes take no room
    try:
        synth.synth_h3(root, spec, components=components)
    finally:  # a test process goes on writing real checkpoints
        synth.write_safetensors, synth.require_space = write, space


def with_reference_dit(profile):
    """`profile` with ref2va's `transformer_ref` among its components (`h3` leaves it out: 61.7 GiB more)."""
    from dataclasses import replace

    if "transformer_ref" in profile.components:
        return profile
    return replace(profile, components=(*profile.components, "transformer_ref"))


def committed_runs() -> list[Path]:
    """The trimmed summaries of the H200 runs docs/benchmarks.md reports (t2va, offload, fl2va, ref2va)."""
    return sorted((Path(__file__).resolve().parent.parent / "tests" / "models" / "h200_runs").glob("*.json"))


def compare(measured: dict, root: Path) -> list[dict]:
    """One row per (our run, stage): predicted and measured sums and their ratio."""
    if str(Path(__file__).resolve().parent) not in sys.path:  # bench/ is not a package
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_h3_generate import write_inputs
    from machine.device import DeviceInfo
    from machine.offload import OffloadSettings
    from models.forecast import forecast_generate
    from models.request.params import GenerateParams

    h200 = DeviceInfo(spec="cuda", kind="cuda", index=0, name="NVIDIA H200", unified_memory=False,
                      total_memory=H200_BYTES, source="bench", reason="")
    resident = OffloadSettings(**{f.name: False for f in fields(OffloadSettings)})
    # the harness's offload runs: every flag on, the DiT's model offload resolved off beside its group offload
    offload = OffloadSettings(dit_layerwise_offload=True, dit_cpu_offload=False, text_encoder_cpu_offload=True,
                              image_encoder_cpu_offload=True, vae_cpu_offload=True, pin_cpu_memory=True)
    rows = []
    for name, run in measured["runs"].items():
        if not run.get("ok") or run.get("side") != "ours":
            continue
        # the run's inputs, written again as the harness wrote them (the forecast reads their headers)
        inputs = write_inputs(root.parent / "inputs" / name, run.get("workflow", "t2va"), run["width"], run["height"])
        params = GenerateParams(prompt=measured.get("prompt", "a red fox running through fresh snow at dawn"),
                                height=run["height"], width=run["width"], frames=run["frames"], steps=run["steps"],
                                **inputs)
        settings = offload if run["placement"].startswith("offload") else resident
        forecast = forecast_generate(root, params, device_info=h200, settings=settings, resolved=True,
                                     sequential_components=run["placement"] in ("sequential", "offloadseq"))
        for stage in forecast.stages:
            predicted = stage.host_bytes + stage.device_bytes + forecast.process_host_bytes + H200_STARTUP
            actual = run["peaks"][stage.stage]["sum"]
            rows.append({"run": name, "canvas": f"{run['width']}x{run['height']}", "stage": stage.stage,
                         "predicted_gib": round(predicted / GiB, 2), "measured_gib": round(actual / GiB, 2),
                         "predicted_device_gib": round(stage.device_bytes / GiB, 2),
                         "ratio": round(predicted / actual, 3)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measured", nargs="*", type=Path, default=committed_runs(),
                        help="summaries of bench_h3_generate.py (default: the committed H200 runs)")
    parser.add_argument("--root", help="an existing (sparse) h3 checkpoint; default: write one in a temporary folder")
    parser.add_argument("--write-sparse", metavar="DIR", help="only write the sparse h3 checkpoint to DIR and stop")
    args = parser.parse_args()
    from compare_forecast import worst_line  # bench/, this script's folder

    if args.write_sparse:
        write_sparse_h3(Path(args.write_sparse))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.root) if args.root else Path(tmp) / "h3"
        if not args.root:
            write_sparse_h3(root)
        rows = [{"summary": path.stem, **row} for path in args.measured
                for row in compare(json.loads(path.read_text()), root)]
    print(f"{'summary':<13} {'run':<20} {'canvas':<10} {'stage':<16} {'predicted GiB':>13} {'measured GiB':>13} "
          f"{'ratio':>6}")
    for r in rows:
        print(f"{r['summary']:<13} {r['run']:<20} {r['canvas']:<10} {r['stage']:<16} {r['predicted_gib']:>13.2f} "
              f"{r['measured_gib']:>13.2f} {r['ratio']:>6.3f}")
    print(worst_line(rows, lambda r: f"{r['summary']} {r['run']} {r['stage']}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
