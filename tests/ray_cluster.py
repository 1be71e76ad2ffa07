"""A real Ray cluster of three nodes on this machine for tests (``bench.ray_cluster``: a
head that runs nothing, two workers of 2 CPUs, each node its own raylet). Everything it
starts carries a test tag, and none of it (nor a container or JVM an actor started) may
outlive the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.ray_cluster import LocalRayCluster
from tests.harness import TAG_ENV, poll_for, tagged_env, tagged_processes

__all__ = ["WORKER_CPUS", "ray_cluster"]

WORKER_CPUS = 2


@pytest.fixture
def ray_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[LocalRayCluster]:
    """A started three-node Ray cluster, each worker node with a temporary folder of its
    own (as separate machines have); shut down, with every process it started, after."""
    env, tag = tagged_env()
    for name in (TAG_ENV, "PYSPARK_PYTHON"):
        monkeypatch.setenv(name, env[name])  # the raylets, their workers, the containers
    cluster = LocalRayCluster(workers=2, worker_cpus=WORKER_CPUS,
                              private_tmp=tmp_path / "nodes")
    try:
        yield cluster
    finally:
        cluster.shutdown()
        poll_for(lambda: not tagged_processes(tag), 30, "every Ray process and container to end")
