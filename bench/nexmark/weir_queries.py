"""The Nexmark queries on Weir, written as a user would from the README: a
``ParquetSource`` per event kind with ``EVENT_TIME_COLUMN``, ``SparkSql`` for maps and
filters, ``EventTimeWindows`` for windows, a Parquet ``FileSink``; run on a real master
with two container processes (the sources in container 0, the query and the sink in
container 1, as in the event-time row).

Where Weir lacks something a query needs, the query is written the way a user can
today: q5's "the auctions with the most bids per window" is a second ``SparkSql`` over
each window's counts (a window's counts all go out in one streaming window). q8 is a
window join (``WindowJoin``: persons and auctions per person and 10-second window), then
a ``SparkSql`` keeps each person once per window (a window's pairs all go out in one
streaming window).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import JobResult
from bench.nexmark import compare
from bench.nexmark.generator import parquet_dir
from bench.nexmark.model import AUCTION, BID, PERSON, NexmarkSpec
from bench.nexmark.reference import answer, read_events
from bench.weir_job import _run_app, breakdown
from weir.operators import Dag
from weir.operators.library import EventTimeWindows, FileSink, ParquetSource, WindowJoin
from weir.operators.spark import SparkSql

__all__ = ["SPARK_SETTINGS", "build_dag", "run"]

STREAMING_WINDOW_MS = 500


READ_COLUMNS: dict[tuple[str, str], list[str]] = {
    ("q1", BID): ["auction", "bidder", "price", "date_time", "extra"],
    ("q2", BID): ["auction", "price"],
    ("q5", BID): ["auction", "date_time"],
    ("q7", BID): ["price", "date_time"],
    ("q11", BID): ["bidder", "date_time"],
    ("q8", PERSON): ["id", "name", "date_time"],
    ("q8", AUCTION): ["seller", "date_time"],
}
"""The columns each query's source reads (``ParquetSource(columns=...)``), as a user who
knows the query writes it; Spark's and Flink's planners prune the same columns by
themselves. q0 reads every column."""


def _source(query: str, spec: NexmarkSpec, data: Path, kind: str, events_per_second: float
            ) -> ParquetSource:
    """The kind's files (the columns the query reads), its share of ``events_per_second``
    offered per streaming window."""
    share = {PERSON: 1, AUCTION: 3, BID: 46}[kind] / 50
    rows = max(1, round(events_per_second * share * STREAMING_WINDOW_MS / 1000))
    return ParquetSource(parquet_dir(data, kind), rows_per_window=rows,
                         columns=READ_COLUMNS.get((query, kind)))


SPARK_SETTINGS: dict[str, Any] = {"SPARK_MASTER": "local[2]", "SPARK_SHUFFLE_PARTITIONS": 2,
                                  "SPARK_DRIVER_MEMORY": "2g", "SPARK_WARMUP_ROWS": 200_000}
"""The bench's Spark settings, as for the other rows (tests pass smaller ones)."""


def build_dag(query: str, spec: NexmarkSpec, data: Path, out_dir: Path,
              events_per_second: float, spark: dict[str, Any] | None = None) -> Dag:
    """The query's DAG. Operator names: ``events`` (the bids, or q8's auctions),
    ``persons`` (q8), ``aggregate`` (the query's first Spark operator, whose cost
    breakdown ``make bench`` prints), ``hottest``/``both`` (a second one), ``sink``.
    ``spark``: DAG attributes instead of ``SPARK_SETTINGS``."""
    dag = Dag(f"nexmark-{query}", STREAMING_WINDOW_SIZE_MILLIS=STREAMING_WINDOW_MS,
              CONTAINERS=2, HEARTBEAT_INTERVAL_MILLIS=500, **(spark or SPARK_SETTINGS))
    timed = {"EVENT_TIME_COLUMN": "date_time",
             "WATERMARK_DELAY_MILLIS": spec.watermark_delay_ms}
    sink = dag.add_operator("sink", FileSink(out_dir, format="parquet"), CONTAINER=1)
    if query == "q8":
        auctions = dag.add_operator("events", _source(query, spec, data, AUCTION,
                                                      events_per_second),
                                    CONTAINER=0, **timed)
        persons = dag.add_operator("persons", _source(query, spec, data, PERSON,
                                                      events_per_second),
                                   CONTAINER=0, **timed)
        windows = dag.add_operator("aggregate", WindowJoin(
            "id", "date_time", size_ms=spec.window_ms, right_keys="seller"), CONTAINER=1,
            QUEUE_CAPACITY=256)
        both = dag.add_operator("both", SparkSql(
            "SELECT DISTINCT id, name, window_start FROM input"), CONTAINER=1)
        dag.add_stream("persons", persons.output, windows.left)
        dag.add_stream("auctions", auctions.output, windows.right)
        dag.add_stream("windows", windows.output, both.input)
        dag.add_stream("results", both.output, sink.input)
        return dag
    source = dag.add_operator("events", _source(query, spec, data, BID, events_per_second),
                              CONTAINER=0, **(timed if query in ("q5", "q7", "q11") else {}))
    if query == "q0":
        dag.add_stream("results", source.output, sink.input)
        return dag
    ops: list[Any] = []
    if query == "q1":
        ops.append(("aggregate", SparkSql(
            "SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM input")))
    elif query == "q2":
        ops.append(("aggregate", SparkSql(
            f"SELECT auction, price FROM input WHERE auction % {spec.q2_modulo} = 0")))
    elif query == "q5":
        ops.append(("aggregate", EventTimeWindows.sliding(
            "date_time", size_ms=spec.window_ms, slide_ms=spec.slide_ms, keys="auction",
            aggregations={"num": "count(*)"})))
        ops.append(("hottest", SparkSql(
            "SELECT auction, num, window_start FROM (SELECT auction, num, window_start, "
            "max(num) OVER (PARTITION BY window_start) AS maxn FROM input) WHERE num = maxn")))
    elif query == "q7":
        ops.append(("aggregate", EventTimeWindows.tumbling(
            "date_time", size_ms=spec.window_ms, aggregations={"maxprice": "max(price)"})))
    elif query == "q11":
        ops.append(("aggregate", EventTimeWindows.session(
            "date_time", gap_ms=spec.session_gap_ms, keys="bidder",
            aggregations={"bid_count": "count(*)"})))
    else:
        raise ValueError(f"no Weir DAG for {query!r}")
    upstream = source.output
    for name, op in ops:
        node = dag.add_operator(name, op, CONTAINER=1, QUEUE_CAPACITY=256)
        dag.add_stream(f"into-{name}", upstream, node.input)
        upstream = node.output
    dag.add_stream("results", upstream, sink.input)
    return dag


def _output(out_dir: Path) -> pa.Table | None:
    files = sorted(out_dir.glob("window-*.parquet"))
    return pa.concat_tables(pq.read_table(f) for f in files) if files else None


def _figures(windows: Any, sources: tuple[str, ...]) -> tuple[float, list[float]]:
    """Seconds from the first source window's start to the last result out at the sink,
    and per result window its latency (its close at the sources to its END_WINDOW at the
    sink)."""
    sink = windows.end_ms["sink"]
    src: dict[int, int] = {}
    for name in sources:
        for w, ms in windows.end_ms[name].items():
            src[w] = max(src.get(w, 0), ms)
    results = [w for w, n in windows.processed["sink"].items() if n > 0]
    latencies = [float(sink[w] - src[w]) for w in sorted(results) if w in src]
    first_in = min(src.values()) - STREAMING_WINDOW_MS if src else 0
    last_out = max((sink[w] for w in results), default=0)
    return max(last_out - first_in, 1) / 1000, latencies


def run(query: str, spec: NexmarkSpec, data: Path, events_per_second: float,
        work: Path | None = None, timeout_s: float = 600.0,
        spark: dict[str, Any] | None = None) -> JobResult:
    """Runs the query on Weir over the files under ``data``; checks it exactly."""
    work = Path(work or tempfile.mkdtemp(prefix=f"weir-nexmark-{query}-"))
    out_dir = work / "out"
    dag = build_dag(query, spec, data, out_dir, events_per_second, spark)
    sources = ("events", "persons") if query == "q8" else ("events",)
    operators = (*sources, *(("aggregate",) if query != "q0" else ()), "sink")
    windows, error, wall_s = _run_app(dag, work, timeout_s, operators)
    name = "weir"
    if error:
        return JobResult(name, spec.events, 0.0, [], False, error)
    output = _output(out_dir)
    expected = answer(query, read_events(data), spec)
    if output is None:
        correct, detail = (expected.num_rows == 0), "no output"
    else:
        correct, detail = compare.check(compare.canonical(query, output), expected)
    seconds, latencies = _figures(windows, sources)
    return JobResult(name, spec.events, seconds, latencies, correct, detail, extra={
        "breakdown": breakdown(windows, latencies),
        "offered_events_per_second": events_per_second,
        "streaming_windows": len(windows.end_ms["events"]),
        "wall_seconds_with_startup": round(wall_s, 1)})
