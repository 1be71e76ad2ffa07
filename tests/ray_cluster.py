"""A real Ray cluster of three nodes on this machine for tests: a head that runs nothing
(0 CPUs) and two workers of 2 CPUs each, each node its own raylet process
(``ray.cluster_utils.Cluster``). Everything it starts carries a test tag, and none of it
(nor a container or JVM an actor started) may outlive the test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.harness import TAG_ENV, poll_for, tagged_env, tagged_processes

__all__ = ["RayTestCluster", "ray_cluster"]

WORKER_CPUS = 2


class RayTestCluster:
    """The cluster's ``address`` and its worker nodes; ``kill_node_of(pid)`` removes the
    node whose raylet a process descends from, as when that machine is lost."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.address: str = cluster.address
        self.workers = [n for n in cluster.worker_nodes]

    def _raylet_pid(self, node) -> int:
        return node.all_processes["raylet"][0].process.pid

    def node_of(self, pid: int):
        """The worker node whose raylet ``pid`` descends from (its actor's worker's child)."""
        ancestors = {p.pid for p in psutil.Process(pid).parents()}
        for node in self.workers:
            if self._raylet_pid(node) in ancestors:
                return node
        raise AssertionError(f"pid {pid} runs on no worker node of the test cluster")

    def kill_node_of(self, pid: int) -> None:
        node = self.node_of(pid)
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers.remove(node)


@pytest.fixture
def ray_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RayTestCluster]:
    """A started three-node Ray cluster; shut down, with every process it started, after."""
    from ray.cluster_utils import Cluster

    env, tag = tagged_env()
    for name in (TAG_ENV, "PYSPARK_PYTHON"):
        monkeypatch.setenv(name, env[name])  # the raylets, their workers, the containers
    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=WORKER_CPUS)
        cluster.wait_for_nodes()
        yield RayTestCluster(cluster)
    finally:
        with contextlib.suppress(Exception):
            cluster.shutdown()
        poll_for(lambda: not tagged_processes(tag), 30, "every Ray process and container to end")
