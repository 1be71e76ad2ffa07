"""A Ray cluster on this machine (``ray.cluster_utils.Cluster``): a head that runs nothing
and worker nodes, each its own raylet; and the loss of the node a process runs on, as
when that machine dies. For the recovery row on Ray and the tests."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import psutil

__all__ = ["LocalRayCluster"]


class LocalRayCluster:
    """Started at construction; ``shutdown`` ends every node.

    Args:
        workers: how many worker nodes.
        worker_cpus: the CPUs each worker offers (the head offers none, so every
            container lands on a worker).
        private_tmp: a folder under which each worker node gets a temporary folder of
            its own (its processes' ``TMPDIR``), as separate machines have: nothing a
            container leaves in its temporary folder (default state, logs) is seen from
            another node. None = the machine's, shared.
    """

    def __init__(self, workers: int = 2, worker_cpus: int = 2,
                 private_tmp: str | os.PathLike[str] | None = None) -> None:
        from ray.cluster_utils import Cluster

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no report sent anywhere
        self.worker_cpus = worker_cpus
        self.cluster = Cluster(initialize_head=True, connect=False,
                               head_node_args={"num_cpus": 0, "include_dashboard": False})
        try:
            self.workers: list[Any] = [self.cluster.add_node(
                num_cpus=worker_cpus, **self._node_env(private_tmp, i)) for i in range(workers)]
            self.cluster.wait_for_nodes()
        except BaseException:
            self.shutdown()
            raise
        self.address: str = self.cluster.address

    @staticmethod
    def _node_env(private_tmp: str | os.PathLike[str] | None, index: int) -> dict[str, Any]:
        if private_tmp is None:
            return {}
        folder = os.path.join(os.fspath(private_tmp), f"node-{index}")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        return {"env_vars": {"TMPDIR": folder}}

    def node_of(self, pid: int) -> Any:
        """The worker node whose raylet ``pid`` descends from (a container's actor)."""
        ancestors = {p.pid for p in psutil.Process(pid).parents()}
        for node in self.workers:
            if node.all_processes["raylet"][0].process.pid in ancestors:
                return node
        raise LookupError(f"pid {pid} runs on no worker node of this cluster")

    def kill_node_of(self, pid: int) -> Any:
        """Kills the node ``pid`` runs on, its raylet and every process on it; returns it."""
        node = self.node_of(pid)
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers.remove(node)
        return node

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self.cluster.shutdown()
