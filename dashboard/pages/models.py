"""Models: every checkpoint under the model roots and the Hugging Face cache (diffusers folder, hub snapshot,
single file, GGUF file, unknown), each component's size and dtypes (a GGUF file's quant types), whether its
weights fit this machine, and a button that opens Run with it (a GGUF file as a generate's transformer).
Headers only."""

from __future__ import annotations

import streamlit as st

from core.echo import echo_name
from dashboard import data, form_state, nav
from dashboard import format as fmt
from dashboard.views.models import models_table
from loader.catalog import GGUF_LAYOUT


def main() -> None:
    config = data.config()
    st.title("Models", anchor=False)
    entries, memory = data.models(tuple(str(r) for r in config.model_roots))
    hub = f" (the Hugging Face cache: `{config.hub_cache}`)" if config.hub_cache else ""
    st.caption("Under the model roots " + ", ".join(f"`{r}`" for r in config.model_roots) + hub + ". The fit "
               "weighs each checkpoint's weights at bf16 (a GGUF file's quantized ones as stored) against "
               f"{fmt.gib(memory.bytes, 1)} ({memory.where}): "
               "*needs sequential residency* means one component at a time fits; the Run page's forecast adds "
               "what a run computes.")
    if not entries:
        st.info("No checkpoint under the model roots. Write one with `python -m models synth DIR --profile demo`, "
                "download one with `hf download`, or add a folder to DRAINBOARD_MODEL_ROOTS.")
        return
    st.dataframe(models_table(entries), hide_index=True, width="stretch")
    for i, entry in enumerate(entries):
        left, right = st.columns([5, 1], vertical_alignment="center")
        left.text(f"{echo_name(entry.name)} · {entry.layout} · {entry.verdict or 'broken'}")
        if right.button("Open in Run", key=f"open_{i}", disabled=bool(entry.problems)):
            if entry.layout == GGUF_LAYOUT:  # a DiT only: the generate's transformer, beside a model folder
                form_state.open_transformer(str(entry.path))
                nav.goto("run", kind="generate")
            form_state.open_checkpoint(str(entry.path))
            nav.goto("run", checkpoint=str(entry.path))


main()
