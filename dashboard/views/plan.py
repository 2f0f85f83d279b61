"""The Run page's Plan table: every candidate `--plan fastest` considered, its forecast peak per stage, its
seconds (each lever's start-up included and said) or "no history", the chosen one marked and those that cannot
fit struck through with their stage."""

from __future__ import annotations

from typing import Any

from dashboard import format as fmt
from models.speed.plan import seconds_words


def plan_markdown(planned: dict[str, Any]) -> str:
    """A recorded plan (`models.speed.plan.Plan.to_dict`) as a Markdown table: a row per candidate, in the order of
    preference, with its peak per stage, seconds and the stage nearest its wall against it; the chosen row in
    bold, a row that cannot fit struck through with the stage over its wall."""
    candidates = planned["candidates"]
    stages = list(dict.fromkeys(stage for c in candidates for stage in c["peaks"]))
    head = ["", "candidate", *stages, "seconds", "nearest wall", "verdict"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, c in enumerate(candidates):
        chosen = i == planned["chosen"]
        cells = [c["label"] + ("" if c["lossless"] else " (lossy)"),
                 *(fmt.gib(c["peaks"].get(stage), 2) for stage in stages),
                 seconds_words(c),
                 c["wall"] or fmt.MISSING,
                 "chosen" if chosen else "fits" if c["fits"] else f"does not fit ({c['over_stage']})"]
        if not c["fits"]:
            cells = [f"~~{cell}~~" for cell in cells]
        elif chosen:
            cells = [f"**{cell}**" for cell in cells]
        rows.append("| " + " | ".join(["→" if chosen else "", *(_cell(x) for x in cells)]) + " |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    """A table cell: pipes escaped (a wall's line may hold none, a label never does; a path could)."""
    return text.replace("|", "\\|")
