"""The event-time job on Weir and on Spark Structured Streaming, over the same files.

Both write the input first (untimed, on tmpfs: ``bench.event_time.write_event_time_files``)
and check their output against the reference computed from those files.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.common import JobResult, percentile
from bench.event_time import (
    SPARK,
    WEIR,
    EventTimeSpec,
    check_windows,
    delay_figures,
    emitted_in,
    epoch_ms,
    iso_ms,
    reference_windows,
    spark_delays_ms,
    weir_delays_ms,
    window_table,
    write_event_time_files,
)
from bench.spark_streaming import _session, run_to_end
from bench.weir_job import _run_app, job_figures
from weir.operators import Dag
from weir.operators.library import EventTimeWindows, FileSink, ParquetSource
from weir.operators.windows import make_window_id

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["build_dag", "run_spark", "run_weir"]

_AGGREGATIONS = {"n": "count(*)", "total": "sum(value)"}
_OPERATORS = ("events", "windows", "sink")


def build_dag(spec: EventTimeSpec, input_dir: Path, out_dir: Path, late_dir: Path) -> Dag:
    """The source in container 0; the windows (in Spark) and both sinks in container 1."""
    dag = Dag("bench-event-time", STREAMING_WINDOW_SIZE_MILLIS=spec.streaming_window_ms,
              CONTAINERS=2, HEARTBEAT_INTERVAL_MILLIS=500, SPARK_MASTER="local[2]",
              SPARK_SHUFFLE_PARTITIONS=2, SPARK_DRIVER_MEMORY="2g",
              SPARK_WARMUP_ROWS=1_000_000)
    source = dag.add_operator(
        "events", ParquetSource(input_dir, batch_rows=spec.batch_rows,
                                rows_per_window=spec.rows_per_window),
        CONTAINER=0, EVENT_TIME_COLUMN="ts", WATERMARK_DELAY_MILLIS=spec.watermark_delay_ms)
    windows = dag.add_operator("windows", EventTimeWindows.tumbling(
        "ts", size_ms=spec.window_size_ms, keys="key", aggregations=_AGGREGATIONS),
        CONTAINER=1, QUEUE_CAPACITY=256)
    sink = dag.add_operator("sink", FileSink(out_dir, format="parquet"), CONTAINER=1)
    late = dag.add_operator("late", FileSink(late_dir, format="parquet"), CONTAINER=1)
    dag.add_stream("events", source.output, windows.input)
    dag.add_stream("results", windows.output, sink.input)
    dag.add_stream("too-late", windows.late, late.input)
    return dag


def _sink_output(out_dir: Path) -> tuple[pa.Table, list[int]]:
    """The sink's rows and, per row, the streaming window whose file it is in."""
    tables, ids = [], []
    for path in sorted(out_dir.glob("window-*.parquet")):
        _, base, counter = path.stem.split("-")
        table = pq.read_table(path)
        tables.append(table)
        ids += [make_window_id(int(base), int(counter))] * table.num_rows
    return (pa.concat_tables(tables) if tables else pa.table({})), ids


def _rows(folder: Path) -> int:
    return sum(pq.read_metadata(p).num_rows for p in folder.glob("window-*.parquet"))


def run_weir(spec: EventTimeSpec, work: Path, timeout_s: float = 600.0) -> JobResult:
    """Runs the job on a local master with two container processes; checks the output.

    ``latencies_ms``: the result delay per event-time window (``weir_delays_ms``).
    """
    input_dir, out_dir, late_dir = work / "events", work / "out", work / "late"
    write_event_time_files(spec, input_dir)
    dag = build_dag(spec, input_dir, out_dir, late_dir)
    windows, error, wall_s = _run_app(dag, work, timeout_s, _OPERATORS)
    if error:
        return JobResult(WEIR, spec.events, 0.0, [], False, error)
    output, ids = _sink_output(out_dir)
    late_rows, metrics = _rows(late_dir), windows.metrics.get("windows", {})
    correct, detail = (False, "WRONG: no output") if not output.num_rows else check_windows(
        window_table(output), reference_windows(input_dir, spec.window_size_ms))
    if late_rows or metrics.get("late_rows"):
        correct, detail = False, (f"WRONG: {late_rows} rows on the late port "
                                  f"({metrics.get('late_rows')} counted); expected none")
    seconds, _, _ = job_figures(windows, spec.streaming_window_ms)
    emitted = emitted_in(output.column("window_start").cast(pa.int64()), ids) \
        if output.num_rows else {}
    delays, queued, unknown = weir_delays_ms(emitted, windows.end_ms["events"],
                                             windows.end_ms["windows"])
    return JobResult(WEIR, spec.events, seconds, delays, correct, detail, extra={
        **delay_figures(delays), "delay_unknown_windows": unknown,
        "queued_p50_ms": percentile(queued, 50), "queued_p99_ms": percentile(queued, 99),
        **{f"unqueued_p{q}_ms": percentile([d - w for d, w in zip(delays, queued, strict=True)],
                                           q) for q in (50, 99)},
        "event_time_windows": len(emitted), "late_rows": late_rows,
        "streaming_windows": len(windows.end_ms["events"]),
        "offered_events_per_second": spec.rows_per_window * 1000 / spec.streaming_window_ms,
        "spark_jobs": int(metrics.get("spark[jobs]", 0.0)),
        "wall_seconds_with_startup": round(wall_s, 1),
        "timeline": _timeline(windows.end_ms, windows.processed["windows"]),
    })


def _timeline(end_ms: dict[str, dict[int, int]], rows: dict[int, int]) -> list[list[int]]:
    """Per streaming window: rows the windows operator took, and ms from the first source
    END_WINDOW to the source's and the windows operator's END_WINDOW of the window."""
    source, windows = end_ms["events"], end_ms["windows"]
    zero = min(source.values(), default=0)
    return [[rows.get(w, 0), source[w] - zero, windows.get(w, zero - 1) - zero]
            for w in sorted(source)]


def _spark_schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    return StructType([StructField("ts", TimestampType()), StructField("key", StringType()),
                       StructField("value", LongType())])


def _windowed(df: DataFrame, spec: EventTimeSpec, watermark: bool = True) -> DataFrame:
    """The job: per key and tumbling window of event time, count and sum."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    if watermark:
        df = df.withWatermark("ts", f"{spec.watermark_delay_ms} milliseconds")
    return df.groupBy(F.window("ts", f"{spec.window_size_ms} milliseconds"), "key").agg(
        F.count(F.lit(1)).alias("n"), F.sum("value").alias("total"))


def _flat(df: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    return df.select("key", F.col("window.start").alias("window_start"),
                     F.col("window.end").alias("window_end"), "n", "total")


def _warm_up(spark: SparkSession, spec: EventTimeSpec, events_dir: Path,
             warm_dir: Path) -> None:
    """Batch jobs of the same shape over one trigger's files (the JIT), then a 2-batch
    stream with the watermark (the streaming machinery, state store, callback server)."""
    paths = [str(p) for p in sorted(events_dir.iterdir())[:spec.files_per_trigger]]
    for _ in range(3):
        _flat(_windowed(spark.read.schema(_spark_schema()).parquet(*paths), spec,
                        watermark=False)).toArrow()
    source = warm_dir / "events"
    source.mkdir(parents=True)
    table = pq.read_table(paths[0]).slice(0, 1000)
    for i in range(2):
        pq.write_table(table, source / f"part-{i}.parquet", compression="none",
                       use_dictionary=False)
    query = (_windowed(spark.readStream.schema(_spark_schema())
                       .option("maxFilesPerTrigger", 1).parquet(str(source)), spec)
             .writeStream.outputMode("append")
             .foreachBatch(lambda df, _id: _flat(df).toArrow())
             .option("checkpointLocation", str(warm_dir / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    shutil.rmtree(warm_dir, ignore_errors=True)


def run_spark(spec: EventTimeSpec, work: Path, shuffle_partitions: int = 2) -> JobResult:
    """Runs the job as a Structured Streaming query (``local[2]``) over the files.

    ``withWatermark`` + ``groupBy(window, key)`` in append mode, ``maxFilesPerTrigger``,
    ``Trigger.AvailableNow``, ``foreachBatch`` collecting each micro-batch's output with
    ``toArrow()``. ``seconds``: from ``query.start()`` to the last output collected;
    ``latencies_ms``: the result delay per event-time window (``spark_delays_ms``).
    """
    events_dir, checkpoint_dir = work / "events", work / "checkpoint"
    write_event_time_files(spec, events_dir)
    spark = _session(work, shuffle_partitions, driver_memory="2g")  # as Weir's Spark
    try:
        _warm_up(spark, spec, events_dir, work / "warm")
        outputs: list[pa.Table] = []
        batches: list[int] = []
        last_out = [0.0]

        def per_batch(df: DataFrame, batch_id: int) -> None:
            table = _flat(df).toArrow()
            if table.num_rows:
                outputs.append(table)
                batches.extend([batch_id] * table.num_rows)
                last_out[0] = time.perf_counter()

        reader = (spark.readStream.schema(_spark_schema())
                  .option("maxFilesPerTrigger", spec.files_per_trigger))
        writer = (_windowed(reader.parquet(str(events_dir)), spec).writeStream
                  .outputMode("append").foreachBatch(per_batch)
                  .option("checkpointLocation", str(checkpoint_dir))
                  .trigger(availableNow=True))
        first_in = time.perf_counter()
        query = run_to_end(writer)
        progress = [{"batch": p.batchId, "start_ms": iso_ms(p.timestamp),
                     "trigger_ms": p.durationMs["triggerExecution"], "rows": p.numInputRows,
                     "dropped": sum(s.numRowsDroppedByWatermark for s in p.stateOperators)}
                    for p in query.recentProgress]
        version = spark.version
    finally:
        spark.stop()
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    output = pa.concat_tables(outputs) if outputs else None
    expected = reference_windows(events_dir, spec.window_size_ms)
    # the windows Spark's watermark passes: it stops at the highest event time minus the
    # delay, and never goes to the end of a bounded input
    highest = pc.max(epoch_ms(pq.read_table(events_dir, columns=["ts"]).column("ts")))
    closed_by = highest.as_py() - spec.watermark_delay_ms
    closed = expected.filter(pc.less_equal(
        pc.add(expected["window_start"], spec.window_size_ms), closed_by))
    correct, detail = (False, "WRONG: no output") if output is None else check_windows(
        window_table(output), closed)
    dropped = sum(p["dropped"] for p in progress)
    if dropped:
        correct, detail = False, f"WRONG: {dropped} rows dropped as late; expected none"
    left_out = expected.num_rows - closed.num_rows
    emitted = emitted_in(window_table(output)["window_start"], batches) if output else {}
    delays, unknown = spark_delays_ms(emitted, progress)
    seconds = last_out[0] - first_in
    return JobResult(SPARK, spec.events, seconds, delays, correct, detail, extra={
        **delay_figures(delays), "delay_unknown_windows": unknown,
        "event_time_windows": len(emitted),
        "results_never_closed": left_out, "rows_dropped_by_watermark": dropped,
        "micro_batches": len(progress),
        "timeline": [[p["rows"], p["start_ms"] - progress[0]["start_ms"], p["trigger_ms"]]
                     for p in progress],  # per micro-batch: rows, trigger at, ms
        "events_per_trigger": spec.files_per_trigger * spec.batch_rows,
        "trigger_ms_p50": sorted(p["trigger_ms"] for p in progress)[len(progress) // 2]
        if progress else 0,
        "spark_version": version,
    })
