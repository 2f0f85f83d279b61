"""The Models page's table: every checkpoint under the model roots and the Hugging Face cache, as plain rows."""

from __future__ import annotations

import pandas as pd

from core.echo import echo_name
from dashboard import format as fmt
from loader.catalog import ModelEntry

COLUMNS = ["model", "layout", "size", "components", "fit (weights)", "path"]


def component_summary(entry: ModelEntry) -> str:
    """`transformer 9.20 GiB (BF16, F32) · vae ...`: each component's size and dtypes (names as `echo_name`
    gives them: they come from the checkpoint's own index)."""
    return " · ".join(f"{echo_name(c.name)} {fmt.gib(c.bytes, 2)} ({', '.join(c.dtypes)})" for c in entry.components)


def models_table(entries: list[ModelEntry]) -> pd.DataFrame:
    """One row per checkpoint; a broken one says the loader's first message where the verdict would be."""
    rows = [{
        "model": echo_name(e.name), "layout": e.layout, "size": fmt.gib(e.bytes, 2) if e.components else "-",
        "components": component_summary(e) or "-",
        "fit (weights)": e.verdict or ("broken: " + e.problems[0] if e.problems else "-"), "path": str(e.path),
    } for e in entries]
    return pd.DataFrame(rows, columns=COLUMNS)
