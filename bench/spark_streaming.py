"""The benchmark job in Spark Structured Streaming, the system Weir users would pick instead."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.common import JobResult, JobSpec, check_totals, percentile, write_event_files

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["DEFAULT_EVENTS_PER_TRIGGER", "default_files_per_trigger", "run", "run_to_end"]

DEFAULT_EVENTS_PER_TRIGGER = 1_000_000
"""Events per micro-batch when the spec sets no rate: about what Weir's window holds at 1 M/s."""

_SYSTEM = "spark-structured-streaming"

_LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
"""


def default_files_per_trigger(spec: JobSpec) -> int:
    """Files (one generator batch each) per micro-batch: one Weir window's worth of events.

    At ``spec.rate_per_second`` that is ``rate * window_ms / 1000`` events; with no rate,
    ``DEFAULT_EVENTS_PER_TRIGGER``.
    """
    if spec.rate_per_second is not None:
        events = spec.rate_per_second * spec.window_ms / 1000
    else:
        events = DEFAULT_EVENTS_PER_TRIGGER
    return max(1, round(events / spec.batch_rows))


def run(spec: JobSpec, work_dir: Path, files_per_trigger: int | None = None,
        shuffle_partitions: int = 2) -> JobResult:
    """Runs the job as a Structured Streaming query over Parquet files; returns its result.

    Untimed: the events are written to ``work_dir/events`` as uncompressed, dictionary-free
    Parquet, one generator batch per file (put ``work_dir`` on tmpfs, as Weir's Spark path
    does), the session is started and warmed (batch jobs over one trigger's files, a tiny stream).
    Timed: a query with ``maxFilesPerTrigger=files_per_trigger`` and ``Trigger.AvailableNow``
    whose ``foreachBatch`` groups each micro-batch by key (count, sum) and collects the
    result to the driver with ``toArrow()``; each micro-batch is one window.

    ``seconds`` runs from ``query.start()`` to the last micro-batch's result collected.
    ``latencies_ms`` are per micro-batch ``durationMs.triggerExecution`` from the query's
    progress: from the trigger fixing the batch's input (the window's close) to the batch
    committed, its result on the driver. ``spec.rate_per_second`` only sizes the default
    micro-batch; the files are all there at the start, so Spark reads as fast as it can.
    The run's files are removed from ``work_dir`` at the end.
    """
    files_per_trigger = files_per_trigger or default_files_per_trigger(spec)
    work_dir = Path(work_dir)
    events_dir, checkpoint_dir = work_dir / "events", work_dir / "checkpoint"
    for folder in (events_dir, checkpoint_dir, work_dir / "warm"):
        shutil.rmtree(folder, ignore_errors=True)
    events_dir.mkdir(parents=True)
    files = write_event_files(spec, events_dir)

    started = time.perf_counter()
    spark = _session(work_dir, shuffle_partitions)
    session_s = time.perf_counter() - started
    try:
        started = time.perf_counter()
        _warm_up(spark, events_dir, work_dir / "warm", files_per_trigger)
        warm_s = time.perf_counter() - started

        outputs: list[pa.Table] = []
        batch_walls_ms: list[float] = []
        last_out = [0.0]

        def per_batch(df: DataFrame, batch_id: int) -> None:
            begin = time.perf_counter()
            outputs.append(_aggregate(df).toArrow())
            last_out[0] = time.perf_counter()
            batch_walls_ms.append((last_out[0] - begin) * 1000)

        reader = (spark.readStream.schema(_spark_schema())
                  .option("maxFilesPerTrigger", files_per_trigger))
        writer = (reader.parquet(str(events_dir)).writeStream
                  .foreachBatch(per_batch)
                  .option("checkpointLocation", str(checkpoint_dir))
                  .trigger(availableNow=True))
        first_in = time.perf_counter()
        query = run_to_end(writer)
        progress = [p for p in query.recentProgress if p.numInputRows > 0]
        seconds = last_out[0] - first_in
        version = spark.version
    finally:
        spark.stop()
        for folder in (events_dir, checkpoint_dir):
            shutil.rmtree(folder, ignore_errors=True)

    totals = _totals(outputs)
    correct, detail = check_totals(totals, spec.expected())
    latencies = [float(p.durationMs["triggerExecution"]) for p in progress]
    add_batch = [float(p.durationMs.get("addBatch", 0)) for p in progress]
    return JobResult(
        system=_SYSTEM, events=spec.events, seconds=seconds,
        latencies_ms=latencies, correct=correct, detail=detail,
        extra={
            "latency": "durationMs.triggerExecution per micro-batch (from the query progress)",
            "micro_batches": len(outputs),
            "progress_batches": len(progress),
            "events_per_trigger": files_per_trigger * spec.batch_rows,
            "files_per_trigger": files_per_trigger,
            "files": files,
            "shuffle_partitions": shuffle_partitions,
            "session_start_s": round(session_s, 3),
            "warm_up_s": round(warm_s, 3),
            "add_batch_p50_ms": percentile(add_batch, 50),
            "foreach_batch_wall_p50_ms": percentile(batch_walls_ms, 50),
            "foreach_batch_wall_p99_ms": percentile(batch_walls_ms, 99),
            "spark_version": version,
        },
    )


def run_to_end(writer: Any) -> Any:
    """Starts a streaming query (``Trigger.AvailableNow``) and waits until it has read all
    its input; raises if it failed. Returns the query (its progress)."""
    query = writer.start()
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")
    return query


def _session(work_dir: Path, shuffle_partitions: int, driver_memory: str = "1g"
             ) -> SparkSession:
    """A classic ``local[2]`` session set up for small frequent jobs, logging warnings only."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    log4j = work_dir / "log4j2.properties"
    log4j.write_text(_LOG4J)
    settings = {
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log4j}",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.default.parallelism": str(shuffle_partitions),
        "spark.sql.adaptive.enabled": "false",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": driver_memory,
        "spark.sql.streaming.numRecentProgressUpdates": "10000",
        "spark.sql.warehouse.dir": str(work_dir / "warehouse"),
    }
    builder = SparkSession.builder.master("local[2]").appName("weir-bench-spark-ss")
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _spark_schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType([StructField("key", StringType()), StructField("value", LongType()),
                       StructField("event_time_ms", LongType())])


def _aggregate(df: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return df.groupBy("key").agg(F.count(F.lit(1)).alias("count"), F.sum("value").alias("sum"))


def _warm_up(spark: SparkSession, events_dir: Path, warm_dir: Path, files: int) -> None:
    """Runs the job's code paths: batch jobs over one trigger's files, then a 2-batch stream.

    The batch jobs let the JIT compile the scan and aggregation at full size; the tiny
    stream starts the streaming machinery and the ``foreachBatch`` callback server.
    """
    paths = sorted(events_dir.iterdir())
    first = paths[0]
    for _ in range(3):
        df = spark.read.schema(_spark_schema()).parquet(*(str(p) for p in paths[:files]))
        _aggregate(df).toArrow()
    source = warm_dir / "events"
    source.mkdir(parents=True)
    table = pq.read_table(first).slice(0, 1000)
    for i in range(2):
        pq.write_table(table, source / f"part-{i}.parquet", compression="none",
                       use_dictionary=False)
    query = (spark.readStream.schema(_spark_schema()).option("maxFilesPerTrigger", 1)
             .parquet(str(source)).writeStream
             .foreachBatch(lambda df, _id: _aggregate(df).toArrow())
             .option("checkpointLocation", str(warm_dir / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    shutil.rmtree(warm_dir, ignore_errors=True)


def _totals(outputs: list[pa.Table]) -> dict[str, tuple[int, int]]:
    """Per-key (count, sum) added up over all micro-batches."""
    if not outputs:
        return {}
    table = pa.concat_tables(outputs).group_by("key").aggregate(
        [("count", "sum"), ("sum", "sum")])
    keys = table.column("key").to_pylist()
    counts = pc.cast(table.column("count_sum"), pa.int64()).to_pylist()
    sums = pc.cast(table.column("sum_sum"), pa.int64()).to_pylist()
    return {k: (c, s) for k, c, s in zip(keys, counts, sums, strict=True)}


if __name__ == "__main__":
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    parent = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="weir-bench-spark-", dir=parent) as scratch:
        result = run(JobSpec(events=events), Path(scratch))
    print(json.dumps(result.to_dict(), indent=2))
