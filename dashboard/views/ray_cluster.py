"""The System page's Ray section as data: each node's memory, GPUs and running job (only with `ray_address` set)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from dashboard import format as fmt
from storage.config import Config


@dataclass
class RayClusterView:
    """What the section shows: a caption, then the nodes' table or why the cluster gave none."""

    caption: str
    """Where jobs run and what `memory` means."""
    nodes: pd.DataFrame | None
    """One row per node (`node_table`); None when the cluster did not answer."""
    problem: str | None
    """The one line shown when the cluster did not answer."""


def node_table(nodes: list) -> pd.DataFrame:
    """One row per node (`jobs.backends.ray_state.RayNode`), in the page's units."""
    return pd.DataFrame([{"node": n.ip + (" (head)" if n.head else ""), "state": n.state, "memory": fmt.gib(n.memory),
                          "GPUs": f"{n.gpus:g}", "running job": n.job or "—"} for n in nodes],
                        columns=["node", "state", "memory", "GPUs", "running job"])


def ray_cluster_view(config: Config, cluster_nodes: Callable[[str], list] | None = None) -> RayClusterView | None:
    """The section, or None without a Ray address; `cluster_nodes` asks the cluster (default
    `jobs.backends.ray_state.cluster_nodes`). Whatever the cluster does becomes `problem`, never an exception."""
    if not config.ray_address:
        return None
    caption = (f"Jobs run on the Ray cluster at {config.ray_address}; memory is Ray's `memory` resource, "
               "what a job's memory limit or budget is placed against.")
    try:
        if cluster_nodes is None:
            from jobs.backends.ray_state import cluster_nodes
        nodes = cluster_nodes(config.ray_address)
    except Exception as e:  # noqa: BLE001 - the page must draw whatever the cluster does
        return RayClusterView(caption, None, f"The Ray cluster at {config.ray_address} does not answer: {e}")
    return RayClusterView(caption, node_table(nodes), None)
