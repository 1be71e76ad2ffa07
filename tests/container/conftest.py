"""Fixtures of the container tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def fresh_bridge():
    """A small Spark session of the module's own (``local[1]``, one shuffle partition), for
    tests of what a new bridge does first (schemas it infers, queries it warms), which the
    session-wide ``bridge`` has long done."""
    from weir.runtime.spark.bridge import SparkSessionBridge

    spark = SparkSessionBridge(master="local[1]", shuffle_partitions=1)
    yield spark
    spark.stop()
