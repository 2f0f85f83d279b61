"""`device` command: show the probe for a device spec and what the offload policy would do there.

`loader.cli` adds it with `register(subparsers)`; `python -m machine.device_cli [SPEC] [--json]`
runs it on its own. With `--json`, stdout holds exactly one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from machine.device import probe_device
from core.command_line import CliParser, run_cli
from machine.offload import OffloadSettings, resolve_offload

_HELP = "probe a device and show the offload decisions the default settings would get on it"
_EPILOG = "example: python -m loader device cuda:0 --json   (DRAINBOARD_UNIFIED_MEMORY=1 forces unified memory)"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `device` subcommand to a parent CLI."""
    parser = subparsers.add_parser("device", help=_HELP, description=_HELP, epilog=_EPILOG)
    _add_arguments(parser)
    return parser


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", nargs="?", default="cuda", help="cpu, cuda, cuda:N or mps (default: cuda)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the probe and the decisions; exit code 0 (a bad spec or override value raises DeviceError: exit 2)."""
    device = probe_device(args.spec)
    settings, decisions = resolve_offload(OffloadSettings(), device)
    if args.json:
        print(json.dumps({
            "device": device.to_dict(),
            "decisions": [decision.to_dict() for decision in decisions],
            "settings": settings.to_dict(),
        }, indent=2))
        return 0
    memory = "unified" if device.unified_memory else "discrete"
    total = f"{device.total_memory / 2**30:.1f} GiB" if device.total_memory is not None else "unknown size"
    print(f"device:   {device.spec} = {device.name} ({device.kind})")
    print(f"memory:   {memory}, {total}")
    print(f"source:   {device.source}")
    print(f"reason:   {device.reason}")
    print("decisions for the default offload settings:")
    for decision in decisions:
        print(f"  {decision}")
    if not decisions:
        print("  none: every flag stays as set")
    print("settings: " + ", ".join(f"{k}={'on' if v else 'off'}" for k, v in settings.to_dict().items()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = CliParser(prog="python -m machine.device_cli", description=_HELP, epilog=_EPILOG)
    _add_arguments(parser)
    return run_cli(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
