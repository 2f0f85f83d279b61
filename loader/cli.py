"""`python -m loader`: inspect a checkpoint, load one (printing the LoadReport), forecast a load, probe a device.

Expected failures (bad path, malformed checkpoint, mismatch, bad device)
print one line and exit 2; with `--json` stdout holds exactly one JSON
object either way, and progress goes to stderr only when it is a terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from .placement.advice import warn_about_mode
from .api import load_checkpoint
from .options import LoadOptions
from .checkpoint import discover_checkpoint
from core.echo import echo_name
from core.sizes import format_size
from core.errors import PlacementError
from machine import device_cli
from core.command_line import CliParser, dtype_type, run_cli
from core.dtype_names import dtype_help
from .placement import known_placements, modes_help
from .model_registry import load_model_builders
from .process import configure_process
from .report import TensorPlaced

_GiB = 1024**3
EXAMPLES = """examples:
  python -m loader inspect data/models/demo --json
  python -m loader load data/models/demo --component transformer --mode drain --dtype bf16
  python -m loader forecast data/models/demo --component transformer --mode stream --json
  python -m loader device --json
  python -m loader models /srv/models --json
"""


def _inspect(args: argparse.Namespace) -> int:
    index = discover_checkpoint(args.path, roots=args.root)
    summary = index.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    pipeline = f", {echo_name(summary['pipeline_class'])}" if summary["pipeline_class"] else ""
    path = echo_name(summary["path"])
    named = f"{echo_name(summary['name'])}: {path}" if summary["name"] != summary["path"] else path
    print(
        f"{named} ({summary['layout']}{pipeline}): {summary['tensors']} tensors,"
        f" {summary['bytes'] / _GiB:.2f} GiB"
    )
    for c in summary["components"]:
        dtypes = ", ".join(f"{echo_name(k)} {v / _GiB:.2f} GiB" for k, v in c["dtypes"].items())
        print(
            f"  {echo_name(c['name'])}: {c['tensors']} tensors in {c['shards']} shard(s), {c['bytes'] / _GiB:.2f} GiB"
            f" [{dtypes}] class={echo_name(c['class_name'] or '-')}"
        )
    for a in summary["non_weight"]:
        print(f"  {echo_name(a['name'])}: no weights ({len(a['files'])} file(s)) class={echo_name(a['class_name'] or '-')}")
    for name in summary["absent"]:
        print(f"  {echo_name(name)}: listed in {echo_name(summary['index_file'])}, no folder here")
    return 0


def _models(args: argparse.Namespace) -> int:
    from core.hub_cache import hub_cache_folder

    from .catalog import find_models, machine_memory

    folders = [Path(f) for f in args.folders]
    hub = hub_cache_folder()
    if not args.no_hub_cache and hub.is_dir() and hub not in folders:
        folders.append(hub)
    memory = machine_memory()
    entries = find_models(folders, memory.bytes) if folders else []
    if args.json:
        print(json.dumps({"folders": [str(f) for f in folders], "memory_bytes": memory.bytes,
                          "memory": memory.where, "models": [e.to_dict() for e in entries]}, indent=2))
        return 0
    if not folders:
        print(f"no folder given and no Hugging Face cache at {hub}")
    for e in entries:
        verdict = f"{e.verdict} ({format_size(memory.bytes)}, {memory.where})" if e.verdict else "broken"
        print(f"{echo_name(e.name)}  [{e.layout}]  {format_size(e.bytes)}  {verdict}  {echo_name(e.path)}")
        for c in e.components:
            dtypes = ", ".join(f"{echo_name(k)} {format_size(v)}" for k, v in c.dtypes.items())
            print(f"  {echo_name(c.name)}: {format_size(c.bytes)} [{dtypes}]")
        for problem in e.problems[:3]:
            print(f"  ! {problem}")
    return 0


class _ProgressBar:
    """One redrawn line on stderr: placed tensors, GiB and RSS."""

    def __init__(self, stream=sys.stderr):
        self._stream = stream

    def __call__(self, event: TensorPlaced) -> None:
        width = 30
        filled = width * event.index // max(event.total, 1)
        self._stream.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {event.index}/{event.total}"
            f" {event.bytes_placed / _GiB:.2f} GiB placed, RSS {event.sample.vm_rss / _GiB:.2f} GiB"
        )
        if event.index == event.total:
            self._stream.write("\n")
        self._stream.flush()


def _load(args: argparse.Namespace) -> int:
    if args.nproc > 1:
        if args.skeleton:
            raise PlacementError("--skeleton is not offered for sharded loads (--nproc); load with one process")
        from .sharded.launch import run_sharded_cli

        return run_sharded_cli(args)
    configure_process(args.device)
    progress = _ProgressBar() if sys.stderr.isatty() else None
    if args.builder_plugins:
        load_model_builders()
    warn_about_mode(args.mode, args.device)
    module, report = load_checkpoint(
        args.path,
        LoadOptions(component=args.component, mode=args.mode, device=args.device, dtype=args.dtype, roots=args.root,
                    drop_page_cache=args.drop_page_cache, skeleton=args.skeleton),
        on_tensor=progress,
    )
    if args.json:
        print(json.dumps({**report.to_dict(), "module_class": type(module).__name__}, indent=2))
        return 0
    print(
        f"{echo_name(type(module).__name__)}, {report.mode} on {report.device}: {report.tensors_placed}/{report.tensors_total} tensors,"
        f" {report.bytes_placed / _GiB:.2f} GiB in {report.load_seconds:.2f} s ({report.throughput_gbps:.2f} GB/s)"
    )
    print(
        f"footprint_ratio {report.footprint_ratio:.3f}  host_peak_ratio {report.host_peak_ratio:.3f}"
        f"  memavailable_cost_ratio {report.memavailable_cost_ratio:.3f}"
        f"  peak_device_allocated {report.peak_device_allocated_bytes / _GiB:.2f} GiB"
    )
    return 0


def _forecast(args: argparse.Namespace) -> int:
    from .forecast import forecast_load

    forecast = forecast_load(
        args.path, component=args.component, mode=args.mode, device=args.device, dtype=args.dtype, roots=args.root
    )
    if args.json:
        print(json.dumps(forecast.to_dict(), indent=2))
        return 0
    f = forecast
    print(
        f"{echo_name(f.component)} {f.mode} on {f.device}: predicted peak {f.predicted_peak_bytes / _GiB:.2f} GiB,"
        f" footprint_ratio {f.predicted_footprint_ratio:.3f} of {f.bytes_placed / _GiB:.2f} GiB placed"
        f" (staging {f.staging_bytes / _GiB:.3f}, mapped {f.mapped_bytes / _GiB:.2f},"
        f" conversion {f.conversion_bytes / _GiB:.3f} GiB)"
    )
    return 0


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    """The options `load` and `forecast` share: what to load, how and where."""
    parser.add_argument("path", help="model folder, component folder or .safetensors file")
    parser.add_argument("--component", help="component of a model folder (default: the only one, or transformer)")
    parser.add_argument("--mode", default="stream", choices=known_placements(), metavar="MODE",
                        help=f"placement mode (default: stream): {modes_help()}")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default: cpu)")
    parser.add_argument("--dtype", type=dtype_type, help=f"target dtype: {dtype_help()} (default: the checkpoint's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    _add_root_option(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(prog="python -m loader", description="Drainboard's frugal checkpoint loader", epilog=EXAMPLES)
    sub = parser.add_subparsers(dest="command", required=True)
    inspect = sub.add_parser(
        "inspect",
        help="list components, tensor counts, bytes and dtypes (headers only)",
        epilog="example: python -m loader inspect /models/h3 --json",
    )
    inspect.add_argument("path", help="model folder, component folder or .safetensors file")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    _add_root_option(inspect)
    inspect.set_defaults(func=_inspect)
    load = sub.add_parser(
        "load",
        help="load one component and print its LoadReport",
        epilog="example: python -m loader load /models/h3 --component transformer --mode stream --dtype bf16 --json",
    )
    _add_load_options(load)
    load.add_argument(
        "--drop-page-cache", action=argparse.BooleanOptionalAction, default=None,
        help="drop each shard's pages from the page cache once read (stream only; default: on for unified-memory GPUs)",
    )
    load.add_argument(
        "--skeleton", action="store_true",
        help="build the module from the checkpoint's own names and shapes, even where its config names a known"
        " class (load tensors of another layout as a generic checkpoint)",
    )
    load.add_argument(
        "--nproc", type=int, default=1,
        help="shard over N local ranks via torchrun (device cpu: gloo, cuda: one GPU per rank; see docs/sharded.md)",
    )
    load.set_defaults(func=_load)
    forecast = sub.add_parser(
        "forecast",
        help="predict a load's peak memory and footprint_ratio from headers alone",
        epilog="example: python -m loader forecast /models/h3 --component transformer --mode drain --dtype bf16 --json",
    )
    _add_load_options(forecast)
    forecast.set_defaults(func=_forecast)
    models = sub.add_parser(
        "models",
        help="list every checkpoint under the folders and the Hugging Face cache (.gguf files too): layout,"
             " component sizes and dtypes (a GGUF file's quant types), and whether the weights fit this machine"
             " (headers only)",
        epilog="example: python -m loader models /srv/models --json",
    )
    models.add_argument("folders", nargs="*", metavar="FOLDER", help="folders to look in, each a model root")
    models.add_argument("--no-hub-cache", action="store_true",
                        help="leave out the Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub, else"
                             " ~/.cache/huggingface/hub)")
    models.add_argument("--json", action="store_true", help="print one JSON object")
    models.set_defaults(func=_models)
    device_cli.register(sub)
    return parser


def _add_root_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root", action="append", metavar="FOLDER",
        help="a model root every checkpoint file must resolve under, links resolved (repeatable;"
        " default: the checkpoint's own folder)",
    )


def main(argv: Sequence[str] | None = None, *, builder_plugins: bool = False) -> int:
    """Run the command line; `builder_plugins` (what `python -m loader` passes) first registers the plugins'
    model classes (`model_registry.load_model_builders`), so `load` builds their classes."""
    configure_process()
    parser = build_parser()
    parser.set_defaults(builder_plugins=builder_plugins)
    return run_cli(parser, argv)
