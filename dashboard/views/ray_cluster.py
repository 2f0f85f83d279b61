"""The System page's Ray section: each node's memory, GPUs and running job (only with `ray_address` set)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import format as fmt
from storage.config import Config


def node_table(nodes: list) -> pd.DataFrame:
    """One row per node (`jobs.backends.ray_state.RayNode`), in the page's units."""
    return pd.DataFrame([{"node": n.ip + (" (head)" if n.head else ""), "state": n.state, "memory": fmt.gib(n.memory),
                          "GPUs": f"{n.gpus:g}", "running job": n.job or "—"} for n in nodes],
                        columns=["node", "state", "memory", "GPUs", "running job"])


def ray_cluster_section(config: Config) -> None:
    """Draw the section; nothing without a Ray address, one warning when the cluster does not answer."""
    if not config.ray_address:
        return
    st.subheader("Ray cluster")
    st.caption(f"Jobs run on the Ray cluster at {config.ray_address}; memory is Ray's `memory` resource, "
               "what a job's memory limit or budget is placed against.")
    try:
        from jobs.backends.ray_state import cluster_nodes

        nodes = cluster_nodes(config.ray_address)
    except Exception as e:  # noqa: BLE001 - the page must draw whatever the cluster does
        st.warning(f"The Ray cluster at {config.ray_address} does not answer: {e}", icon=":material/cloud_off:")
        return
    st.dataframe(node_table(nodes), hide_index=True, width="stretch")
