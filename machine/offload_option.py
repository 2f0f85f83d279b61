"""`--offload FLAG=on|off`: the one command-line option every command sets offload flags with."""

from __future__ import annotations

import argparse
from dataclasses import fields

from .offload import OffloadSettings


def add_offload_option(parser: argparse.ArgumentParser) -> None:
    """`--offload FLAG=on|off` (repeatable, `all` for every flag): how every command sets offload flags.
    The parsed value is a dict of flag -> bool, over the flags' defaults (all on)."""
    names = [f.name for f in fields(OffloadSettings)]

    def parse(item: str) -> tuple[str, bool]:
        name, _, value = item.partition("=")
        if name not in (*names, "all") or value not in ("on", "off"):
            raise argparse.ArgumentTypeError(f"expected FLAG=on or FLAG=off with FLAG one of all, {', '.join(names)};"
                                             f" got {item!r}")
        return name, value == "on"

    parse.__name__ = "offload flag"

    class Collect(argparse.Action):
        def __call__(self, parser, namespace, value, option_string=None):
            flags = dict(getattr(namespace, self.dest) or {})
            name, on = value
            flags.update(dict.fromkeys(names, on) if name == "all" else {name: on})
            setattr(namespace, self.dest, flags)

    parser.add_argument("--offload", action=Collect, type=parse, default={}, metavar="FLAG=on|off",
                        help="set an offload flag (repeatable; all=off for every flag; default: all on, the policy "
                             "turns them off where they do not apply), e.g. --offload dit_cpu_offload=off")
