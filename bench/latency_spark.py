"""The latency row on Spark Structured Streaming: the paced generator as a Python
streaming data source (the built-in ``rate`` source hands over whole seconds only), the
map as ``mapInArrow``, the count as a ``groupBy`` per micro-batch in ``foreachBatch``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from bench.latency import (
    SPARK,
    TRIGGERS_MS,
    LatencySpec,
    check_counts,
    check_map,
    event_batch,
    figures,
    keeps_up,
    map_value,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["PacedSource", "probe", "run"]

_DDL = "seq long, key string, value long, created_ms long"


@dataclasses.dataclass
class _Range(InputPartition):
    first: int
    end: int
    keys: int
    start_ms: int
    rate: int


class _PacedReader(DataSourceStreamReader):
    """Offsets are events due by now on the schedule (``bench.latency.due_ms``) from the
    reader's creation (the query's start), at most ``total``."""

    def __init__(self, options: dict[str, str]) -> None:
        self.rate, self.keys = int(options["rate"]), int(options["keys"])
        self.total = int(options["total"])
        self.start_ms = time.time_ns() // 1_000_000

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's name
        return {"seq": 0}

    def latestOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's name
        elapsed = time.time_ns() // 1_000_000 - self.start_ms
        return {"seq": min(self.total, ((elapsed + 1) * self.rate + 999) // 1000)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[_Range]:
        return [_Range(start["seq"], end["seq"], self.keys, self.start_ms, self.rate)]

    def read(self, partition: _Range) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        for first in range(partition.first, partition.end, 65_536):
            yield event_batch(first, min(65_536, partition.end - first), partition.keys,
                              partition.start_ms, partition.rate)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to free: events are made on demand."""


class PacedSource(DataSource):
    """``spark.readStream.format("weir_paced")``: options ``rate``, ``keys``, ``total``."""

    @classmethod
    def name(cls) -> str:
        return "weir_paced"

    def schema(self) -> str:
        return _DDL

    def streamReader(self, schema: Any) -> _PacedReader:  # noqa: N802 - Spark's name
        return _PacedReader(self.options)


def _query(spark: SparkSession, spec: LatencySpec, trigger_ms: int, total: int,
           checkpoint: Path, timeout_s: float) -> tuple[list[pa.Table], list[dict[str, Any]]]:
    """Runs the job on ``total`` events at ``trigger_ms``; returns its sink's tables (each
    with ``arrival_ms``; the count's also ``newest_ms`` per key) and its progress."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    tables: list[pa.Table] = []

    def per_batch(df: DataFrame, _batch_id: int) -> None:
        if spec.job == "count":
            df = df.groupBy("key").agg(F.count(F.lit(1)).alias("count"),
                                       F.sum("value").alias("sum"),
                                       F.max("created_ms").alias("newest_ms"),
                                       F.min("created_ms").alias("oldest_ms"))
        table = df.toArrow()
        arrival = time.time_ns() // 1_000_000
        if table.num_rows:
            tables.append(table.append_column("arrival_ms", pa.array(
                np.full(table.num_rows, arrival, np.int64))).append_column(
                "batch", pa.array(np.full(table.num_rows, _batch_id, np.int64))))

    events = (spark.readStream.format("weir_paced").option("rate", spec.rate_per_second)
              .option("keys", spec.keys).option("total", total).load())
    if spec.job == "map":  # mapInArrow and pandas UDFs need pandas, not installed here
        events = events.select("seq", "key", F.udf(map_value, "long")("value").alias("mapped"),
                               "created_ms")
    query = (events.writeStream.foreachBatch(per_batch)
             .trigger(processingTime=f"{trigger_ms} milliseconds")
             .option("checkpointLocation", str(checkpoint)).start())
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and query.exception() is None:
            last = query.lastProgress
            if last and last["sources"] and _seq(last["sources"][0]["endOffset"]) >= total:
                break
            time.sleep(0.2)
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the streaming query did not finish in {timeout_s:.0f} s")
        progress = [{"batch": p.batchId, "rows": p.numInputRows,
                     "trigger_ms": p.durationMs.get("triggerExecution", 0)}
                    for p in query.recentProgress if p.numInputRows > 0]
    finally:
        query.stop()
    return tables, progress


def _seq(offset: Any) -> int:
    import json

    if isinstance(offset, str):
        offset = json.loads(offset)
    return int(offset["seq"]) if isinstance(offset, dict) else -1


def _session(work: Path, spec: LatencySpec, timeout_s: float) -> SparkSession:
    """A ``local[2]`` session (``bench.spark_streaming``'s settings) with the source
    registered, warmed by the job itself (2 s of events at a 500 ms trigger, its output
    dropped), as Weir's Spark is warmed before its source starts."""
    from bench.spark_streaming import _session as session

    spark = session(work, shuffle_partitions=2)
    spark.dataSource.register(PacedSource)
    _query(spark, spec, 500, 2 * spec.rate_per_second, work / "warm-up", timeout_s)
    return spark


def _probe(spark: SparkSession, spec: LatencySpec, work: Path, timeout_s: float
           ) -> tuple[int, list[dict[str, Any]]]:
    """The smallest of ``TRIGGERS_MS`` Spark sustains (``keeps_up`` over each probe's
    last two thirds), or the largest tried; each try's figures."""
    tries = []
    for trigger in TRIGGERS_MS:
        total = int(spec.rate_per_second * spec.probe_s)
        _, progress = _query(spark, spec, trigger, total, work / f"probe-{trigger}", timeout_s)
        timed = [float(p["trigger_ms"]) for p in progress[len(progress) // 3:]]
        ok = keeps_up(trigger, timed)
        tries.append({"trigger_ms": trigger, "batches": len(timed), "kept_up": ok,
                      "behind": sum(1 for t in timed if t > trigger),
                      "batch_p50_ms": float(np.median(timed)) if timed else 0.0})
        if ok:
            return trigger, tries
    return TRIGGERS_MS[-1], tries


def probe(spec: LatencySpec, work: Path, timeout_s: float = 300.0) -> dict[str, Any]:
    """``bench.one spark-latency --probe``: the trigger to use for ``spec.job``."""
    spark = _session(work, spec, timeout_s)
    try:
        trigger, tries = _probe(spark, spec, work, timeout_s)
    finally:
        spark.stop()
    return {"system": SPARK, "job": spec.job, "trigger_ms": trigger, "probes": tries}


def run(spec: LatencySpec, work: Path, timeout_s: float = 300.0) -> dict[str, Any]:
    """The job at ``spec.trigger_ms`` (0: probe first) on ``spec.events`` events."""
    spark = _session(work, spec, timeout_s)
    tries: list[dict[str, Any]] = []
    try:
        trigger = spec.trigger_ms
        if not trigger:
            trigger, tries = _probe(spark, spec, work, timeout_s)
        tables, progress = _query(spark, spec, trigger, spec.events, work / "checkpoint",
                                  timeout_s)
        version = spark.version
    finally:
        spark.stop()
    base = {"system": SPARK, "job": spec.job, "events": spec.events}
    if not tables:
        return {**base, "correct": False, "detail": "WRONG: the sink got nothing"}
    out = pa.concat_tables(tables)
    arrival = out["arrival_ms"].to_numpy()
    if spec.job == "map":
        correct, detail = check_map(out["seq"].to_numpy(), out["mapped"].to_numpy(),
                                    spec.events, spec.keys)
        created = out["created_ms"].to_numpy()
        counted = np.ones(len(created), np.int64)
        start_ms = int(created.min())
    else:
        correct, detail = check_counts(out, spec.events, spec.keys)
        per = out.group_by("batch").aggregate([("newest_ms", "max"), ("arrival_ms", "max"),
                                               ("count", "sum"), ("oldest_ms", "min")])
        created, arrival = per["newest_ms_max"].to_numpy(), per["arrival_ms_max"].to_numpy()
        counted = per["count_sum"].to_numpy()
        start_ms = int(per["oldest_ms_min"].to_numpy().min())  # event 0's: the schedule's
    figs = figures(created, arrival, counted, start_ms + int(spec.warmup_s * 1000))
    batch_ms = [float(p["trigger_ms"]) for p in progress]
    return {**base, **figs, "correct": correct, "detail": detail, "extra": {
        "trigger_ms": trigger, "probes": tries, "micro_batches": len(progress),
        "batches_behind": sum(1 for t in batch_ms if t > trigger),
        "batch_p50_ms": float(np.median(batch_ms)) if batch_ms else 0.0,
        "batch_p99_ms": float(np.percentile(batch_ms, 99)) if batch_ms else 0.0,
        "spark_version": version}}
