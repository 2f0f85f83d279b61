"""The System page's Ray section as data (`dashboard.views.ray_cluster`): no Streamlit, whatever the cluster does."""

from __future__ import annotations

from dashboard.views.ray_cluster import ray_cluster_view
from jobs.backends.ray_state import RayNode
from storage.config import Config

ADDRESS = "http://head:8265"


def test_without_a_ray_address_there_is_no_section(tmp_path):
    def never(address):
        raise AssertionError("asked a cluster that is not configured")

    assert ray_cluster_view(Config(tmp_path), never) is None


def test_each_node_is_a_row_in_the_pages_units(tmp_path):
    nodes = [RayNode("a", "10.0.0.1", True, "ALIVE", 64 * 2**30, 1.0, "7"),
             RayNode("b", "10.0.0.2", False, "DEAD", 32 * 2**30, 0.0, None)]
    view = ray_cluster_view(Config(tmp_path, ray_address=ADDRESS), lambda address: nodes)
    assert view.problem is None and ADDRESS in view.caption
    assert view.nodes.to_dict("records")[0]["node"] == "10.0.0.1 (head)"
    assert list(view.nodes["running job"]) == ["7", "—"] and list(view.nodes["GPUs"]) == ["1", "0"]


def test_a_cluster_that_does_not_answer_is_one_line_not_an_exception(tmp_path):
    def refuse(address):
        raise ConnectionError("connection refused")

    view = ray_cluster_view(Config(tmp_path, ray_address=ADDRESS), refuse)
    assert view.nodes is None
    assert view.problem == f"The Ray cluster at {ADDRESS} does not answer: connection refused"
