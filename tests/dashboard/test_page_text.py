"""What the pages say, read off every element Streamlit would send (labels, help, tables, chart specs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["run", "job", "history", "compare", "models", "system"]
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


STAGES = ["probe", "load.text_encoder", "encode", "denoise.denoise", "decode.video"]
"""A generate job's internal stage names, as the runner records them."""
UNSAID = re.compile(
    r"\bNone\b|\b[A-Z][a-z]\w*(?:Error|Exception)\b|strict=False|\bstage_(?:start|end)\b|offload_decision"
    r"|\b(?:load\.text_encoder|denoise\.denoise|decode\.video|dit_cpu_offload|dit_layerwise_offload|tensors_total)\b"
)
"""What no page may say: raw None, exception class names, Python arguments, event kinds, stage names, flags, metric keys."""
TOOLTIP_FIELDS = ("help", "spec", "id", "form_id", "data", "default", "value", "url", "script_hash", "tooltip")
"""Proto fields that are not text on the page: tooltips (help), chart specs, ids, raw widget values."""


def visible_text(at: AppTest) -> str:
    """What a user reads: every element's text fields (not its tooltip or chart spec) and every cell of its tables."""
    parts: list[str] = []

    def walk(node) -> None:
        proto = getattr(node, "proto", None)
        if proto is not None and hasattr(proto, "ListFields"):
            for field, value in proto.ListFields():
                if field.name in TOOLTIP_FIELDS:
                    continue
                if isinstance(value, str):
                    parts.append(value)
                elif isinstance(value, (list, tuple)) or type(value).__name__.startswith("Repeated"):
                    parts.extend(v for v in value if isinstance(v, str))
            if type(proto).__name__ in ("Dataframe", "Table"):  # every cell of st.dataframe / st.table
                parts.append(_cells(proto, node.value).to_string())
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at._tree)
    return "\n".join(parts)


def _cells(proto, value):
    """A table's cells as the browser shows them: a Styler's display values where it sent them, else the data."""
    import pyarrow as pa

    styler = getattr(proto.arrow_data, "styler", None)
    if styler is not None and styler.display_values:
        shown = pa.ipc.open_stream(styler.display_values).read_all().to_pandas()
        return shown.where(shown.notna() & (shown != ""), value.astype(object).where(value.notna(), "None"))
    return value.astype(object).where(value.notna(), "None")  # a null cell reads "None" in the grid


def _add_generate_with_internal_names(db, job_adder, load_samples, model: str) -> list[int]:
    """A finished generate job, a failed and a killed one, whose samples, events and errors carry the
    runner's internal names, as a real run records them."""
    import time

    from storage.events_table import add_event

    staged = load_samples.assign(stage=[STAGES[min(len(STAGES) - 1, i * len(STAGES) // len(load_samples))]
                                        for i in range(len(load_samples))])
    generate = {"prompt": "a fox", "seed": 1, "steps": 3, "frames": 124, "height": 64, "width": 64, "fps": 24}
    done = job_adder(db, status="succeeded", kind="generate", samples=staged, model=model, generate=generate,
                     metrics={"peak_footprint": 2**30, "stage_peaks": {"denoise.denoise": 2**30},
                              "stage_seconds": {"denoise.denoise": 2.0}, "tensors_total": 96,
                              "loads": {"text_encoder": {"mode": "stream", "device": "cpu", "bytes_placed": 2**20}}})
    now = time.time()
    for t, kind, stage in ((0.0, "stage_start", "probe"), (1.0, "stage_start", "load.text_encoder"),
                           (2.0, "stage_start", "denoise.denoise"), (4.0, "stage_end", "denoise.denoise"),
                           (4.1, "offload_decision", "load.transformer")):
        add_event(db, done, kind, f"{stage} {'started' if kind == 'stage_start' else 'done after 2.00 s'}", t=t,
                  stage=stage, data={"flag": "dit_cpu_offload"}, created_at=now)
    failed = job_adder(db, status="failed", model=model, samples=staged.iloc[:10], error=(
        "PlacementError: strict load failed; 1 missing from /m: a.weight; 1 unexpected in /m: b.weight "
        "(pass strict=False to load anyway)"))
    killed = job_adder(db, status="killed", kind="generate", model=model, samples=staged.iloc[:90], signal="SIGKILL",
                       generate=generate, error="killed (SIGKILL), most likely by the kernel OOM killer; last sample at "
                       "3.9 s: stage denoise.denoise, VmRSS 1.08 GiB, MemAvailable 19.2 GiB")
    return [done, failed, killed]


@pytest.mark.parametrize(("name", "which"), [("run", 0), ("system", 0), ("compare", 0), ("history", 0),
                                             ("job", 0), ("job", 1), ("job", 2)])
def test_no_page_shows_none_a_class_name_or_an_internal_name(name, which, fresh_db, job_adder, load_samples, tiny_checkpoint):
    """`which` picks the job the Job page shows: the finished generate, the failed load, the killed generate."""
    ids = _add_generate_with_internal_names(fresh_db, job_adder, load_samples, str(tiny_checkpoint))
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / f"{name}.py"), default_timeout=60)
    at.query_params["job"] = str(ids[which])
    at.query_params["jobs"] = ",".join(map(str, ids))
    at.run()
    assert not at.exception, at.exception
    text = visible_text(at)
    assert len(text) > 500 and ("a fox" in text or name != "history")  # the scan read the page's own content
    found = sorted(set(UNSAID.findall(text)))
    assert found == [], f"the {name} page (job {ids[which]}) shows {found}"
