"""A failure in the user's words: one plain sentence, near-identical lines folded, and what to do next.

The stored error keeps everything the runner knew (class names, every tensor); the pages
show it cleaned up here and keep the raw text one click away.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

from dashboard import format as fmt
from dashboard import words

CLASS_PREFIX = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Warning|Failed|Refused)\s*:\s*")
"""`PlacementError: ` or `core.errors.CheckpointError: ` at the start of a line."""
CLASS_NAME = re.compile(r"\b[A-Z][a-z]\w*(?:Error|Exception)\b")
"""An exception class named anywhere in a line."""
PYTHON_HINTS = re.compile(r"\s*\((?:pass|use|set) \w+=\w+[^)]*\)|;?\s*(?:pass|use|set) \w+=\w+ to [^;.]*")
"""Advice a page user cannot follow: `(pass strict=False to load anyway)`."""
PAST_END = re.compile(
    r"^(?P<file>[^:]+): tensor '(?P<name>[^']*)' has data_offsets \[\d+, (?P<end>\d+)\] past the end of the "
    r"(?P<size>\d+)-byte data area(?: \(truncated\?\))?$"
)
"""The loader's line for one tensor a truncated shard cuts off (loader/validate.py)."""
STAGE_NAMED = re.compile(r"\bstage ([a-z_]+(?:\.[a-z_]+)?)\b")
"""`stage load.text_encoder` in the runner's lines (jobs/outcome.py): the stage's internal name."""
SUPERVISOR_ID = re.compile(r"\s*\((?:supervisor )?[\w.-]+:\d+:[0-9a-f]{8}\)")
"""` (host:4242:1a2b3c4d)`: a supervisor's internal id (jobs.supervisor), which the pages leave out."""
SHARD_OF = re.compile(r"-(\d+)-of-(\d+)\.")
"""`model-00002-of-00003.safetensors`: shard 2 of 3."""


def plain(line: str) -> str:
    """One line without a leading class name, Python-argument advice or a doubled status word."""
    text = CLASS_PREFIX.sub("", line.strip())
    text = PYTHON_HINTS.sub("", text).strip()
    text = SUPERVISOR_ID.sub("", text)
    text = STAGE_NAMED.sub(lambda m: f"while {words.stage(m.group(1))}", text)
    return re.sub(r"^(killed|failed|cancelled):\s+(?=\1\b)", "", text, flags=re.IGNORECASE)


def _shard_name(file: str) -> str:
    match = SHARD_OF.search(file)
    return f"shard {int(match.group(1))} of {int(match.group(2))} ({file})" if match else file


def fold(lines: list[str]) -> list[str]:
    """Near-identical lines made one: every tensor a truncated shard cuts off becomes
    "shard 2 of 3 (f.safetensors) is truncated (8.6 MiB of 15.5 MiB of data, 19 tensors cut off): copy it
    again". Order is kept."""
    cut: dict[str, list[re.Match]] = defaultdict(list)
    out: list[str | tuple[str]] = []
    for line in lines:
        match = PAST_END.match(line.strip())
        if match:
            if match["file"] not in cut:
                out.append((match["file"],))
            cut[match["file"]].append(match)
        else:
            out.append(line)
    result = []
    for item in out:
        if isinstance(item, tuple):
            found = cut[item[0]]
            have = int(found[0]["size"])
            need = max(int(m["end"]) for m in found)
            tensors = f"{len(found)} tensor{'s' if len(found) != 1 else ''} cut off"
            result.append(f"{_shard_name(item[0])} is truncated ({fmt.gib(have, 2)} of {fmt.gib(need, 2)} of data, "
                          f"{tensors}): copy it again")
        else:
            result.append(item)
    return result


def sentences(text: str) -> list[str]:
    """An error's text as plain, folded lines (its `; `-joined parts split when there are several problems)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) == 1 and lines[0].count("; ") >= 3:
        lines = [part for part in lines[0].split("; ") if part.strip()]
    return [plain(line) for line in fold([plain(line) for line in lines])]


def has_class_name(text: str) -> bool:
    return bool(CLASS_NAME.search(text))


NICE_STEP = 256 * fmt.MIB
"""A suggested limit is rounded up to this (256 MiB), so it reads like a size a person would type."""


def round_up(nbytes: float) -> int:
    return int(math.ceil(nbytes / NICE_STEP) * NICE_STEP)


def limit_needed(*, limit: int, usage_at_kill: int | None, baseline: int | None, placed_fraction: float | None,
                 predicted_peak: int | None = None) -> int:
    """The smallest memory limit that would have worked, from what the job measured: its usage when
    killed, extrapolated over what was still to place (a load grows about linearly with bytes
    placed), or the forecast's peak over the baseline, whichever is larger, plus 10%; never below
    the limit that failed plus one step."""
    base = baseline or 0
    estimates = [limit + NICE_STEP]
    if usage_at_kill:
        grown = max(0, usage_at_kill - base)
        share = placed_fraction if placed_fraction and placed_fraction > 0.05 else 1.0
        estimates.append(base + grown / min(1.0, share))
    if predicted_peak:
        estimates.append(base + predicted_peak)
    return round_up(max(estimates) * 1.1)


def next_step(kind: str | None, *, limit: int | None, budget: int | None, suggested_limit: int | None,
              mode: str | None) -> str | None:
    """What to do after a kill, one sentence; None for a kill with no cause the page can act on."""
    cheapest = mode == "stream"  # already the cheapest mode: no advice to choose it
    if kind == "oom" and limit:
        return (f"It needed more than its {fmt.gib(limit)} memory limit: retry with a limit of "
                f"{fmt.gib(suggested_limit)}" + ("." if cheapest else ", or choose a cheaper mode."))
    if kind == "guard":
        told = f"its memory budget of {fmt.gib(budget)}" if budget else "the guard's MemAvailable floor"
        remedy = ("raise the budget" if budget else "lower the floor") + (
            "" if cheapest else " or choose a cheaper mode (stream, about 1.0× the checkpoint)")
        return f"The memory guard stopped it at {told}, before the kernel had to: {remedy}."
    if kind == "oom":
        cheaper = ", or choose stream, the cheapest mode (about 1.0×)" if mode != "stream" else ""
        return (f"The machine ran out of memory: close programs that use memory (the System page lists the "
                f"largest){cheaper}, then retry.")
    return None
