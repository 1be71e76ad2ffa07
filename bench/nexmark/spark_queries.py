"""The Nexmark queries on Spark Structured Streaming, as its users write them: a Parquet
file source per event kind over the same files as Weir (``maxFilesPerTrigger``),
``withWatermark`` and ``window``/``session_window`` aggregations in append mode,
``Trigger.AvailableNow``, and ``foreachBatch`` writing each micro-batch's output as
Parquet files (as Weir's ``FileSink`` and Flink's filesystem sink write theirs), read back
for the check once the query ended. The driver has the 2 GB Weir's Spark has.

q5's "auctions with the most bids per window" is computed in ``foreachBatch`` over each
micro-batch's closed windows (append mode emits a window's counts all at once), as Weir
does it in a second ``SparkSql``; q8 is a union grouped per person (a window join of
two streams would need both sides' watermarks and a time range); q3 and q20 are
stream-stream joins with no time bound, q18 ``dropDuplicates``, q19 each window's
bids per auction collected, sorted and cut to the top ``n``. q9 (an aggregation after
a join with no window) is not supported in append mode: Spark does not run it.

Spark's watermark stops at the highest event time read minus the delay and never passes
the last windows of a bounded input, so those are left out of its check
(``reference.closed``).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import JobResult
from bench.nexmark import compare
from bench.nexmark.generator import parquet_dir
from bench.nexmark.model import AUCTION, BID, PERSON, NexmarkSpec, inputs_of
from bench.nexmark.reference import answer, closed, final_watermark, read_events
from bench.spark_streaming import _session, run_to_end

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["OUT_DIR", "RESULT_FILES", "run"]

_SYSTEM = "spark-structured-streaming"

OUT_DIR, RESULT_FILES = "out", "part-*.parquet"
"""Where under the run's work folder ``foreachBatch`` writes, and its files' names: read
back for the check and, by ``bench.output_times``, for the times from outside."""


def _schema(kind: str) -> Any:
    """The kind's Spark schema, from the files' Arrow schema."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from bench.nexmark.model import SCHEMAS

    return from_arrow_schema(SCHEMAS[kind])


def _stream(spark: SparkSession, data: Path, kind: str, files_per_trigger: int,
            watermark_ms: int | None) -> DataFrame:
    df = (spark.readStream.schema(_schema(kind)).option("maxFilesPerTrigger", files_per_trigger)
          .parquet(str(parquet_dir(data, kind))))
    if watermark_ms is not None:
        df = df.withWatermark("date_time", f"{watermark_ms} milliseconds")
    return df


def query_frame(query: str, spark: SparkSession, spec: NexmarkSpec, data: Path,
                files_per_trigger: int) -> DataFrame:
    """The query as a streaming DataFrame (before ``foreachBatch``'s last step)."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    delay = spec.watermark_delay_ms
    size, slide = f"{spec.window_ms} milliseconds", f"{spec.slide_ms} milliseconds"
    timed = query in ("q5", "q7", "q8", "q11", "q19")
    if query in ("q3", "q20"):  # regular joins: no watermark, every row kept
        return _regular_join(query, spark, spec, data, files_per_trigger)
    if query == "q8":
        persons = _stream(spark, data, PERSON, files_per_trigger, delay).select(
            "id", "name", "date_time", F.lit(1).alias("is_person"))
        sellers = _stream(spark, data, AUCTION, files_per_trigger, delay).select(
            F.col("seller").alias("id"), F.lit(None).cast("string").alias("name"),
            "date_time", F.lit(0).alias("is_person"))
        grouped = persons.unionByName(sellers).groupBy(F.window("date_time", size), "id").agg(
            F.max("name").alias("name"), F.sum("is_person").alias("persons"),
            F.sum(1 - F.col("is_person")).alias("auctions"))
        return grouped.where("persons > 0 AND auctions > 0").select(
            "id", "name", F.col("window.start").alias("window_start"))
    bids = _stream(spark, data, BID, files_per_trigger, delay if timed else None)
    if query == "q0":
        return bids
    if query == "q1":
        return bids.selectExpr("auction", "bidder", "0.908 * price AS price", "date_time",
                               "extra")
    if query == "q2":
        return bids.where(f"auction % {spec.q2_modulo} = 0").select("auction", "price")
    if query == "q5":
        return bids.groupBy(F.window("date_time", size, slide), "auction").agg(
            F.count(F.lit(1)).alias("num")).select(
            "auction", "num", F.col("window.start").alias("window_start"))
    if query == "q7":
        return bids.groupBy(F.window("date_time", size)).agg(
            F.max("price").alias("maxprice")).select(
            F.col("window.start").alias("window_start"), "maxprice")
    if query == "q18":
        return bids.select("auction", "bidder", "price", "date_time").dropDuplicates(
            ["bidder", "auction"])
    if query == "q19":
        ranked = F.slice(F.sort_array(F.collect_list(F.struct("price", "bidder")),
                                      asc=False), 1, spec.top_n)
        top = bids.groupBy(F.window("date_time", size), "auction").agg(ranked.alias("top"))
        return top.select("auction", F.col("window.start").alias("window_start"),
                          F.posexplode("top").alias("position", "bid")).select(
            "auction", "window_start", (F.col("position") + 1).alias("rank"),
            F.col("bid.price").alias("price"), F.col("bid.bidder").alias("bidder"))
    if query == "q11":
        gap = f"{spec.session_gap_ms} milliseconds"
        return bids.groupBy(F.session_window("date_time", gap), "bidder").agg(
            F.count(F.lit(1)).alias("bid_count")).select(
            "bidder", "bid_count", F.col("session_window.start").alias("window_start"),
            F.col("session_window.end").alias("window_end"))
    raise ValueError(f"no Spark query for {query!r}")


def _regular_join(query: str, spark: SparkSession, spec: NexmarkSpec, data: Path,
                  files_per_trigger: int) -> DataFrame:
    """q3 and q20: stream-stream inner joins with no time bound (Spark keeps both sides'
    rows for ever, as Flink's regular join and Weir's ``RegularJoin`` do)."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    auctions = _stream(spark, data, AUCTION, files_per_trigger, None).where(
        F.col("category") == spec.category)
    if query == "q3":
        persons = _stream(spark, data, PERSON, files_per_trigger, None).where(
            F.col("state").isin(*spec.q3_states)).select(
            F.col("id").alias("seller_id"), "name", "city", "state")
        return auctions.select("id", "seller").join(
            persons, F.col("seller") == F.col("seller_id")).select("name", "city", "state",
                                                                   "id")
    bids = _stream(spark, data, BID, files_per_trigger, None).select(
        "auction", "bidder", "price", "channel", "url", "date_time")
    items = auctions.select("id", "item_name", "description", "initial_bid", "reserve",
                            "expires", "seller", "category")
    return bids.join(items, F.col("auction") == F.col("id")).drop("id")


def _finish(query: str, df: DataFrame) -> DataFrame:
    """The micro-batch's last step: q5 keeps each window's most-bid auctions."""
    if query != "q5":
        return df
    from pyspark.sql import Window
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    best = F.max("num").over(Window.partitionBy("window_start"))
    return df.withColumn("maxn", best).where("num = maxn").drop("maxn")


def run(query: str, spec: NexmarkSpec, data: Path, work: Path, files_per_trigger: int,
        shuffle_partitions: int = 2, warm_up: bool = True) -> JobResult:
    """Runs the query as a Structured Streaming query (``local[2]``) over the files;
    checks it exactly. Untimed: the session's start and, with ``warm_up``, a warm-up (the
    same query as a short stream over the first trigger's files, twice), which a user
    does not run: timed from outside, the runner turns it off. ``seconds``: from
    ``start()`` to the last output collected; ``latencies_ms``: per micro-batch with
    input, its ``triggerExecution``. ``extra["system_returned_at"]``: the epoch second
    the session had stopped, before the check."""
    checkpoint = work / "checkpoint"
    out_dir = work / OUT_DIR
    spark = _session(work, shuffle_partitions, driver_memory="2g")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    try:
        if warm_up:
            _warm_up(query, spark, spec, data, work / "warm", files_per_trigger)
        last_out = [0.0]

        def per_batch(df: DataFrame, batch_id: int) -> None:
            _finish(query, df).write.mode("append").parquet(str(out_dir))
            last_out[0] = time.perf_counter()

        frame = query_frame(query, spark, spec, data, files_per_trigger)
        writer = (frame.writeStream.outputMode("append").foreachBatch(per_batch)
                  .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True))
        first_in = time.perf_counter()
        streaming = run_to_end(writer)
        progress = [p for p in streaming.recentProgress if p.numInputRows > 0]
        version = spark.version
    finally:
        spark.stop()
        returned_at = time.time()  # the user's program is done: before the check
        shutil.rmtree(checkpoint, ignore_errors=True)
    events = read_events(data, query)
    expected = answer(query, events, spec)
    if query in ("q5", "q7", "q8", "q11", "q19"):
        expected = closed(query, expected, spec, final_watermark(query, events, spec))
    output = _written(out_dir)
    if output is None:
        correct, detail = (expected.num_rows == 0), "no output"
    else:
        correct, detail = compare.check(compare.canonical(query, output), expected)
    latencies = [float(p.durationMs["triggerExecution"]) for p in progress]
    return JobResult(_SYSTEM, spec.events, last_out[0] - first_in, latencies, correct, detail,
                     extra={"micro_batches": len(progress), "files_per_trigger":
                            files_per_trigger, "spark_version": version,
                            "results_checked": expected.num_rows, "warm_up": warm_up,
                            "system_returned_at": returned_at})


def _written(out_dir: Path) -> pa.Table | None:
    """The Parquet files the micro-batches wrote, as one table (None: no row)."""
    files = sorted(out_dir.glob(RESULT_FILES))
    tables = [t for t in (pq.read_table(f) for f in files) if t.num_rows]
    return pa.concat_tables(tables, promote_options="permissive") if tables else None


def _warm_up(query: str, spark: SparkSession, spec: NexmarkSpec, data: Path, warm: Path,
             files_per_trigger: int) -> None:
    """The query's code paths, untimed: a short stream over copies of the first files
    (the JIT, the streaming machinery, the ``foreachBatch`` callback server)."""
    for kind in inputs_of(query):
        folder = parquet_dir(warm, kind)
        folder.mkdir(parents=True, exist_ok=True)
        for path in sorted(parquet_dir(data, kind).iterdir())[:files_per_trigger]:
            shutil.copy(path, folder / path.name)
    for round_ in range(2):
        writer = (query_frame(query, spark, spec, warm, files_per_trigger).writeStream
                  .outputMode("append")
                  .foreachBatch(lambda df, _id: _finish(query, df).write.mode("append")
                                .parquet(str(warm / "out")))
                  .option("checkpointLocation", str(warm / f"checkpoint-{round_}"))
                  .trigger(availableNow=True))
        run_to_end(writer)
    shutil.rmtree(warm, ignore_errors=True)
