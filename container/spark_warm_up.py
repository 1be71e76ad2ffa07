"""The jobs that warm a SparkSession up: grouped aggregations of the common shape, run
until their time settles, so no window pays the JVM's cold JIT."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from container.spark_bridge import SparkSessionBridge

__all__ = ["run_warm_up_jobs"]


def run_warm_up_jobs(bridge: SparkSessionBridge, rows: int, max_rounds: int) -> None:
    """Groups ``rows`` rows by 10,000 string keys and by their int32 codes (the layout
    ``WindowedCount`` hands Spark), round after round, until a round is no longer more
    than 20 % faster than the one before, or ``max_rounds`` ran."""
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    rows = max(1, rows)
    keys = pa.array([f"k{i:04d}" for i in range(10_000)]).take(
        pa.array(np.arange(rows) % 10_000))
    codes = pa.array(np.arange(rows) % 10_000, pa.int32())
    batch = pa.record_batch({"k": keys, "c": codes, "v": pa.array(np.arange(rows))})
    previous = float("inf")
    for _ in range(max_rounds):
        started = time.perf_counter()
        with bridge.job():
            df = bridge.to_dataframe([batch], batch.schema)
            for key in ("k", "c"):
                bridge.to_arrow(df.groupBy(key).agg(F.count(F.lit(1)), F.sum("v")))
        took = time.perf_counter() - started
        if took > 0.8 * previous:  # no longer getting faster: warm
            break
        previous = took
