"""What the pages say, read off every element Streamlit would send (labels, help, tables, chart specs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["run", "job", "history", "compare", "system"]
INTERNAL_NAME = re.compile(r"\b(?:[A-Z]{2,}\.md|DESIGN)\b")
"""Names of the working documents behind the product (upper-case `*.md` files, "DESIGN ..."), which users never have."""


def page_text(at: AppTest) -> str:
    """Every element's protobuf as text, so column headings, help texts and chart titles count too."""
    parts: list[str] = []

    def walk(node) -> None:
        proto = getattr(node, "proto", None)
        if proto is not None:
            parts.append(str(proto))
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at._tree)
    return "\n".join(parts)


@pytest.mark.parametrize("name", PAGES)
def test_no_page_names_an_internal_document(name, fresh_db, job_adder, load_samples, tiny_checkpoint):
    ids = [
        job_adder(fresh_db, status="succeeded", mode=mode, samples=load_samples, model=str(tiny_checkpoint),
                  metrics={"bytes_placed": 2 * 2**30, "footprint_ratio": ratio, "load_seconds": 3.0})
        for mode, ratio in (("stream", 1.0), ("drain", 1.16))
    ]
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / f"{name}.py"), default_timeout=60)
    at.query_params["job"] = str(ids[0])
    at.query_params["jobs"] = ",".join(map(str, ids))
    at.run()
    assert not at.exception, at.exception
    text = page_text(at)
    assert len(text) > 1000  # the walk saw the page, not an empty tree
    found = INTERNAL_NAME.findall(text)
    assert found == [], f"the {name} page names {found}"
