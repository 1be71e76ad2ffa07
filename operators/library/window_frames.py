"""The Spark DataFrames of ``EventTimeWindows`` whose windows keep their rows: each window
of the open rows with its aggregates, and the rows' sessions (a number per key and the
session's end, by window functions)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from weir.operators.watermarks import NO_WATERMARK

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from weir.operators.library.event_windows import EventTimeWindows
    from weir.operators.library.window_panes import Panes
    from weir.operators.library.window_sessions import Sessions

__all__ = ["NEW", "SESSION", "SESSION_END", "TIME", "as_utc_ms", "live_sessions_frame",
           "sessions_frame", "warm_window_jobs", "windows_frame"]

TIME = "__weir_event_ms"  # the event time as epoch ms, kept beside the rows in the state
NEW = "__weir_new"  # the row arrived in this window (its window may need to go out again)
SESSION, SESSION_END = "__weir_session", "__weir_session_end"  # a row's session, its end


def windows_frame(df: DataFrame, op: EventTimeWindows) -> DataFrame:
    """Every window of the open rows with its aggregates, its end in ms and whether a
    new row is in it."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    keys = [F.col(k) for k in op.keys]
    aggregates = [F.expr(expression).alias(name)
                  for name, expression in op.aggregations.items()]
    touched = F.max(F.col(NEW)).alias("touched")
    if op.kind == "session":
        grouped = df.groupBy(*keys, SESSION).agg(
            F.min(TIME).alias("__start_ms"), F.max(SESSION_END).alias("__end_ms"),
            touched, *aggregates)
        start, end = F.col("__start_ms"), F.col("__end_ms")
    else:
        stamp = F.timestamp_millis(F.col(TIME))
        slot = F.window(stamp, f"{op.size_ms} milliseconds",
                        f"{op.slide_ms} milliseconds")
        grouped = df.groupBy(*keys, slot.alias("__slot")).agg(touched, *aggregates)
        start = F.unix_millis(F.col("__slot.start"))
        end = F.unix_millis(F.col("__slot.end"))
    return grouped.select(
        *keys, F.timestamp_millis(start).alias("window_start"),
        F.timestamp_millis(end).alias("window_end"),
        *[F.col(name) for name in op.aggregations],
        end.alias("window_end_ms"), F.col("touched"))


def sessions_frame(df: DataFrame, keys: list[str], gap_ms: int) -> DataFrame:
    """The rows with their session (a number per key) and its end: a session starts
    at a row ``gap_ms`` or more after the one before it, and ends ``gap_ms`` after its
    last row."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    order = Window.partitionBy(*keys).orderBy(TIME) if keys \
        else Window.orderBy(TIME)
    gap = F.col(TIME) - F.lag(TIME).over(order)
    starts = F.when(gap.isNull() | (gap >= F.lit(gap_ms)), 1).otherwise(0)
    numbered = (df.withColumn("__weir_starts", starts)
                .withColumn(SESSION, F.sum("__weir_starts").over(
                    order.rowsBetween(Window.unboundedPreceding, Window.currentRow))))
    per_session = Window.partitionBy(*keys, SESSION)
    return numbered.withColumn(SESSION_END,
                               F.max(TIME).over(per_session) + F.lit(gap_ms))


def live_sessions_frame(df: DataFrame, op: EventTimeWindows, before: int) -> DataFrame:
    """The open rows in sessions, without the rows of sessions that had closed for
    good by ``before`` (ended, plus the lateness): those went out for the last time
    and no new row may join them, as in Flink, whose state they would have left."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    if before == NO_WATERMARK:
        return sessions_frame(df, op.keys, op.gap_ms)
    columns = df.columns
    old = sessions_frame(df.where(~F.col(NEW)), op.keys, op.gap_ms)
    live = old.where(F.col(SESSION_END) + F.lit(op.allowed_lateness_ms)
                     > F.lit(before)).select(*columns)
    return sessions_frame(live.unionByName(df.where(F.col(NEW))), op.keys, op.gap_ms)


def warm_window_jobs(op: EventTimeWindows, partials: Panes | Sessions | None,
                     attributes: Mapping[str, Any], rounds: int = 3) -> bool:
    """Runs jobs of ``op``'s shape (event time into panes, session stretches or windows,
    grouped with a key) over made-up rows as the operator activates: the container's
    warm-up covers plain groupings only, and the bench measured a cold first
    ``window()`` job at 2.4 s against about 1 s warm. The first round always runs, the
    others until ``SPARK_WARMUP_MILLIS`` passed; ``SPARK_WARMUP_ROWS`` rows. Sessions of
    rows (window functions) are not warmed. Whether it ran."""
    rows = int(attributes.get("SPARK_WARMUP_ROWS") or 0)
    budget_s = int(attributes.get("SPARK_WARMUP_MILLIS", 1_000)) / 1000
    if rows <= 0 or partials is None and op.kind == "session":
        return False
    import numpy as np
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    ids = np.arange(rows)
    batch = pa.record_batch({TIME: pa.array(ids * 3, pa.int64()),
                             "k": pa.array(ids % 1_000, pa.int64())})
    began = time.perf_counter()
    for done in range(rounds):
        if done and time.perf_counter() - began >= budget_s:
            return True
        with op.spark.job():
            df = op.spark.to_dataframe([batch], batch.schema)
            if partials is not None:  # the shape of the partials' job
                slot = F.col(TIME) - F.pmod(F.col(TIME), F.lit(partials.slot_ms))
            else:
                slot = F.window(F.timestamp_millis(F.col(TIME)), f"{op.size_ms} milliseconds",
                                f"{op.slide_ms} milliseconds")
            op.spark.to_arrow(df.groupBy(slot, "k").agg(F.count(F.lit(1)), F.sum(TIME)))
    return True


def as_utc_ms(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """Spark's timestamps as ms in UTC, whatever its session's time zone (the values are
    epoch instants either way: only the label changes)."""
    for name in columns:
        index = table.schema.get_field_index(name)
        if index >= 0:
            column = table.column(index).cast(pa.timestamp("ms", tz="UTC"))
            table = table.set_column(index, name, column)
    return table
