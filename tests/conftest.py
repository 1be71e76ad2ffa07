"""Shared fixtures: Spark kept small, every process started by a test stopped by it."""

from __future__ import annotations

import os
import sys

import pytest

# Spark's Python workers must run this interpreter (it has pyarrow); tests keep Spark small.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture
def state_dir(tmp_path):
    path = tmp_path / "state"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def bridge():
    """One small Spark session (``local[1]``, one shuffle partition) for all unit tests."""
    from container.spark_bridge import SparkSessionBridge

    bridge = SparkSessionBridge(master="local[1]", shuffle_partitions=1)
    yield bridge
    bridge.stop()


@pytest.fixture(scope="session")
def postgres_dsn():
    """A DSN to a real PostgreSQL server for the session (``tests/postgres.py``)."""
    from tests.postgres import postgres_dsn_for_session

    yield from postgres_dsn_for_session()
