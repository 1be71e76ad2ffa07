"""A small Spark bridge for the local test runner (``runtime.local.run``).

It implements ``operators.operator.SparkBridge`` over one local SparkSession, kept for the
whole interpreter (stopped at exit), so a test file with several local runs pays the JVM
start once. Windows reach Spark through ``createDataFrame`` from Arrow: slower per row than
the container's Parquet handoff (``container.spark_bridge``), but a test's windows are
small and this needs no scratch folder. pyspark is imported only when a bridge is made.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["LocalSparkBridge", "shared_bridge"]

_SETTINGS = {
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "1",
    "spark.sql.adaptive.enabled": "false",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",  # as in the containers: event times stay UTC
}
_WARM_UP_ROWS = 5_000
_WARM_UP_ROUNDS = 6
_LOCK = threading.Lock()
_SHARED: dict[str, LocalSparkBridge] = {}


class LocalSparkBridge:
    """``SparkBridge`` over one local session (created on first use).

    Args:
        master: the Spark master URL, ``local[1]`` for tests.
    """

    def __init__(self, master: str = "local[1]") -> None:
        self.master = master
        self._session: SparkSession | None = None
        self._warm = False

    @property
    def session(self) -> SparkSession:
        if self._session is None or self._session.sparkContext._jsc is None:  # stopped
            self._session = self._create()
            self._warm = False
        return self._session

    def to_dataframe(self, batches: list[pa.RecordBatch], schema: pa.Schema,
                     session: SparkSession | None = None) -> DataFrame:
        """A DataFrame over the window's batches (``createDataFrame`` from Arrow)."""
        table = pa.Table.from_batches(batches, schema=schema)
        return (session or self.session).createDataFrame(table)

    def to_arrow(self, df: DataFrame) -> pa.Table:
        """Runs the job; the result as Arrow (``DataFrame.toArrow``)."""
        return df.toArrow()

    def warm_up(self) -> None:
        """Starts the session and runs small jobs of the shapes windows run (Arrow in,
        string functions, a grouped count, Arrow out) until their time settles, once per
        session, as a container does before its sources start: the first windows then do
        not pay the JVM's class loading and cold JIT."""
        if self._warm:
            return
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        text = pa.table({"line": [f"w{i % 97} W{i % 13} x" for i in range(_WARM_UP_ROWS)]})
        previous = float("inf")
        for _ in range(_WARM_UP_ROUNDS):
            started = time.perf_counter()
            df = self.to_dataframe(text.to_batches(), text.schema)
            words = df.select(F.explode(F.split(F.lower("line"), "[^a-z0-9]+")).alias("w"))
            self.to_arrow(words.where(F.col("w") != "").groupBy("w").count())
            took = time.perf_counter() - started
            if took > 0.8 * previous:  # no longer getting faster: warm
                break
            previous = took
        self._warm = True

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None

    def _create(self) -> SparkSession:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        if self.master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no host lookup
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master(self.master).appName("weir-local-run")
        for key, value in _SETTINGS.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        return session


def shared_bridge(master: str = "local[1]") -> LocalSparkBridge:
    """The process's bridge for ``master`` (one session per process: asking for another
    master stops the previous one's session first)."""
    with _LOCK:
        bridge = _SHARED.get(master)
        if bridge is None:
            for other in _SHARED.values():
                other.stop()
            _SHARED.clear()
            bridge = _SHARED[master] = LocalSparkBridge(master)
        return bridge


@atexit.register
def _stop_shared() -> None:
    for bridge in _SHARED.values():
        bridge.stop()
