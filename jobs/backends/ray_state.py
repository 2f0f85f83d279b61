"""What the Ray cluster's state API says about its nodes, for the System page: memory, GPUs, running job."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RayNode:
    """One node of the cluster."""

    node_id: str
    """Ray's node id."""
    ip: str
    """The node's address."""
    head: bool
    """Whether it is the head node."""
    state: str
    """ALIVE or DEAD."""
    memory: int
    """Bytes of Ray's `memory` resource: what jobs asking for memory are placed against."""
    gpus: float
    """GPUs Ray counts on the node."""
    job: str | None
    """The Drainboard job running there (its id), or another Ray job's submission id, or None."""
    cpus: float = 0.0
    """CPUs Ray counts on the node."""


def cluster_nodes(address: str, *, timeout: int = 5) -> list[RayNode]:
    """Every node the cluster at `address` (its dashboard) knows, with the job each runs."""
    from ray.util.state import list_jobs, list_nodes

    running: dict[str, str] = {}
    for job in list_jobs(address=address, timeout=timeout, detail=True, raise_on_missing_output=False):
        if str(job.status).endswith("RUNNING") and job.driver_node_id:
            running[job.driver_node_id] = (job.metadata or {}).get("drainboard_job") or job.submission_id
    return [RayNode(node.node_id, node.node_ip, node.is_head_node, str(node.state),
                    int(node.resources_total.get("memory", 0)), float(node.resources_total.get("GPU", 0)),
                    running.get(node.node_id), float(node.resources_total.get("CPU", 0)))
            for node in list_nodes(address=address, timeout=timeout, detail=True, raise_on_missing_output=False)]
