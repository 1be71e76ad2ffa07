"""The Nexmark queries on Weir, written as a user would from the README: a
``ParquetSource`` per event kind with ``EVENT_TIME_COLUMN``, ``SparkSql`` for maps and
filters, ``EventTimeWindows`` for windows, a Parquet ``FileSink``; run on a real master
with one container process (``CONTAINERS``), as Spark SS runs here in one driver with local
executors and Flink in one mini-cluster. Weir checkpoints every second
(``CHECKPOINT_WINDOW_COUNT=2``), as Spark SS commits every micro-batch: both replay at
most about a second's input after a failure. With the default 10 s, the buffer servers
keep ten seconds of every stream and spill most of it (q1, 6 M events, one run each,
two containers: 475 k events/s with the default, 506 k checkpointing every second; in
one container, 626 k: no stream crosses a process).

Where Weir lacks something a query needs, the query is written the way a user can
today: q5's "the auctions with the most bids per window" is a second ``SparkSql`` over
each window's counts (a window's counts all go out in one streaming window). q8 is a
window join (``WindowJoin``: persons and auctions per person and 10-second window), then
a ``SparkSql`` keeps each person once per window (a window's pairs all go out in one
streaming window).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import JobResult
from bench.nexmark import compare
from bench.nexmark.category_average import CategoryAverage
from bench.nexmark.generator import parquet_dir
from bench.nexmark.model import AUCTION, BID, PERSON, NexmarkSpec, inputs_of
from bench.nexmark.reference import answer, read_events
from bench.nexmark.winning_bids import WinningBids
from bench.weir_job import _run_app, breakdown, first_in_ms, start_up_timeline
from weir.operators import Dag
from weir.operators.library import (
    Deduplicate,
    EventTimeWindows,
    FileSink,
    ParquetSource,
    RegularJoin,
    TopN,
    WindowJoin,
)
from weir.operators.spark import SparkSql

__all__ = ["OUT_DIR", "RESULT_FILES", "SPARK_SETTINGS", "build_dag", "run"]

STREAMING_WINDOW_MS = 500

OUT_DIR, RESULT_FILES = "out", "window-*.parquet"
"""Where under the run's work folder the ``FileSink`` writes, and its files' names: read
back for the check and, by ``bench.output_times``, for the times from outside."""

CONTAINERS = 1
"""Container processes per query: the sources go to the first, every other operator to
the last (2: the sources beside the rest, streams from them over Flight)."""


READ_COLUMNS: dict[tuple[str, str], list[str]] = {
    ("q1", BID): ["auction", "bidder", "price", "date_time", "extra"],
    ("q2", BID): ["auction", "price"],
    ("q3", PERSON): ["id", "name", "city", "state"],
    ("q3", AUCTION): ["id", "seller", "category"],
    ("q5", BID): ["auction", "date_time"],
    ("q7", BID): ["price", "date_time"],
    ("q8", PERSON): ["id", "name", "date_time"],
    ("q8", AUCTION): ["seller", "date_time"],
    ("q4", AUCTION): ["id", "seller", "category", "date_time", "expires"],
    ("q4", BID): ["auction", "bidder", "price", "date_time"],
    ("q9", AUCTION): ["id", "seller", "category", "date_time", "expires"],
    ("q9", BID): ["auction", "bidder", "price", "date_time"],
    ("q11", BID): ["bidder", "date_time"],
    ("q18", BID): ["auction", "bidder", "price", "date_time"],
    ("q19", BID): ["auction", "bidder", "price", "date_time"],
    ("q20", AUCTION): ["id", "item_name", "description", "initial_bid", "reserve", "expires",
                       "seller", "category"],
    ("q20", BID): ["auction", "bidder", "price", "channel", "url", "date_time"],
}
"""The columns each query's source reads (``ParquetSource(columns=...)``), as a user who
knows the query writes it; Spark's and Flink's planners prune the same columns by
themselves. q0 reads every column."""

TIMED = ("q4", "q5", "q7", "q8", "q9", "q11", "q18", "q19")
"""The queries on event time: their sources stamp it (``EVENT_TIME_COLUMN``)."""

JOIN_TTL_MS = 3_600_000
"""q3's and q20's regular joins keep every row an hour of the application's clock: the
whole run, as Spark's and Flink's keep theirs (no TTL)."""


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


def source_names(query: str) -> tuple[str, ...]:
    """The DAG's source operators: ``events`` (the query's last input kind: the bids, or
    the auctions of q3 and q8) and, for a query of two kinds, the first kind's name
    (``persons``, ``auctions``)."""
    kinds = inputs_of(query)
    return ("events", *(f"{kind}s" for kind in kinds[:-1]))


def _operators(query: str, spec: NexmarkSpec) -> list[tuple[str, Any]]:
    """The operators after the source of a one-input query, in order."""
    window = spec.window_ms
    if query == "q1":
        return [("aggregate", SparkSql(
            "SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM input"))]
    if query == "q2":
        return [("aggregate", SparkSql(
            f"SELECT auction, price FROM input WHERE auction % {spec.q2_modulo} = 0"))]
    if query == "q5":
        return [("aggregate", EventTimeWindows.sliding(
                    "date_time", size_ms=window, slide_ms=spec.slide_ms, keys="auction",
                    aggregations={"num": "count(*)"})),
                ("hottest", SparkSql(
                    "SELECT auction, num, window_start FROM (SELECT auction, num, "
                    "window_start, max(num) OVER (PARTITION BY window_start) AS maxn FROM "
                    "input) WHERE num = maxn"))]
    if query == "q7":
        return [("aggregate", EventTimeWindows.tumbling(
            "date_time", size_ms=window, aggregations={"maxprice": "max(price)"}))]
    if query == "q11":
        return [("aggregate", EventTimeWindows.session(
            "date_time", gap_ms=spec.session_gap_ms, keys="bidder",
            aggregations={"bid_count": "count(*)"}))]
    if query == "q18":
        return [("aggregate", Deduplicate(("bidder", "auction"), "date_time",
                                          within_ms=JOIN_TTL_MS))]
    if query == "q19":
        return [("aggregate", TopN("auction", "price", spec.top_n, "date_time",
                                   size_ms=window))]
    raise ValueError(f"no Weir DAG for {query!r}")


def _joined(query: str, spec: NexmarkSpec) -> tuple[Any, str | None, str | None]:
    """A two-input query's operator (ports: the first kind's, then the events'), with a
    ``SparkSql`` filter before each port (None: none)."""
    if query == "q3":
        states = ", ".join(f"'{s}'" for s in spec.q3_states)
        return (RegularJoin("seller_id", ttl_millis=JOIN_TTL_MS, right_keys="seller"),
                "SELECT id AS seller_id, name, city, state FROM input "
                f"WHERE state IN ({states})",
                f"SELECT id, seller FROM input WHERE category = {spec.category}")
    if query == "q8":
        return WindowJoin("id", "date_time", size_ms=spec.window_ms,
                          right_keys="seller"), None, None
    if query in ("q4", "q9"):
        return WinningBids(), None, None
    if query == "q20":
        return (RegularJoin("auction", ttl_millis=JOIN_TTL_MS),
                "SELECT id AS auction, item_name, description, initial_bid, reserve, expires, "
                f"seller, category FROM input WHERE category = {spec.category}", None)
    raise ValueError(f"no Weir DAG for {query!r}")


def build_dag(query: str, spec: NexmarkSpec, data: Path, out_dir: Path,
              events_per_second: float, spark: dict[str, Any] | None = None,
              containers: int = CONTAINERS) -> Dag:
    """The query's DAG. Operator names: the sources (``source_names``), ``aggregate``
    (the query's main operator; a Spark one's cost breakdown ``make bench`` prints),
    ``hottest``/``both``/``filter-*`` (Spark operators around it), ``sink``.
    ``spark``: DAG attributes instead of ``SPARK_SETTINGS``."""
    dag = Dag(f"nexmark-{query}", STREAMING_WINDOW_SIZE_MILLIS=STREAMING_WINDOW_MS,
              CONTAINERS=containers, HEARTBEAT_INTERVAL_MILLIS=500, CHECKPOINT_WINDOW_COUNT=2,
              **(spark or SPARK_SETTINGS))
    rest = containers - 1  # where every operator but the sources goes
    timed = {"EVENT_TIME_COLUMN": "date_time",
             "WATERMARK_DELAY_MILLIS": spec.watermark_delay_ms} if query in TIMED else {}
    sink = dag.add_operator("sink", FileSink(out_dir, format="parquet"), CONTAINER=rest)
    kinds = inputs_of(query)
    names = source_names(query)[::-1]  # in the order of kinds
    sources = [dag.add_operator(name, _source(query, spec, data, kind, events_per_second),
                                CONTAINER=0, **timed)
               for name, kind in zip(names, kinds, strict=True)]
    if len(kinds) == 1:
        ops = _operators(query, spec) if query != "q0" else []
        upstream = sources[0].output
    else:
        op, *filters = _joined(query, spec)
        node = dag.add_operator("aggregate", op, CONTAINER=rest, QUEUE_CAPACITY=256)
        for source_name, source, port, where in zip(names, sources, node.input_ports(),
                                                    filters, strict=True):
            upstream = source.output
            if where is not None:
                name = f"filter-{source_name}"
                step = dag.add_operator(name, SparkSql(where), CONTAINER=rest)
                dag.add_stream(f"into-{name}", upstream, step.input)
                upstream = step.output
            dag.add_stream(f"into-{port}", upstream, getattr(node, port))
        ops = {"q8": [("both", SparkSql("SELECT DISTINCT id, name, window_start FROM input"))],
               "q4": [("average", CategoryAverage())]}.get(query, [])
        upstream = node.output
    for name, op in ops:
        node = dag.add_operator(name, op, CONTAINER=rest, QUEUE_CAPACITY=256)
        dag.add_stream(f"into-{name}", upstream, node.input)
        upstream = node.output
    dag.add_stream("results", upstream, sink.input)
    return dag


def _output(out_dir: Path) -> pa.Table | None:
    files = sorted(out_dir.glob(RESULT_FILES))
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
    first_in = first_in_ms(windows, sources, STREAMING_WINDOW_MS)
    last_out = max((sink[w] for w in results), default=0)
    return max(last_out - first_in, 1) / 1000, latencies


def run(query: str, spec: NexmarkSpec, data: Path, events_per_second: float,
        work: Path | None = None, timeout_s: float = 600.0,
        spark: dict[str, Any] | None = None) -> JobResult:
    """Runs the query on Weir over the files under ``data``; checks it exactly.

    As ``weir run`` does: a master in this process, the DAG submitted, nothing prepared
    before it (the containers' Spark start and its warm-up are the runtime's own: inside
    the clock from outside, overlapped with the sources' first windows).
    ``extra["system_returned_at"]``: the epoch second the application's run returned,
    before the check (``bench.nexmark.one`` times it from outside)."""
    work = Path(work or tempfile.mkdtemp(prefix=f"weir-nexmark-{query}-"))
    out_dir = work / OUT_DIR
    dag = build_dag(query, spec, data, out_dir, events_per_second, spark)
    sources = source_names(query)
    operators = (*sources, *(("aggregate",) if query != "q0" else ()), "sink")
    windows, error, wall_s = _run_app(dag, work, timeout_s, operators)
    returned_at = time.time()  # the application ended, the master stopped: before the check
    name = "weir"
    if error:
        return JobResult(name, spec.events, 0.0, [], False, error,
                         extra={"system_returned_at": returned_at})
    output = _output(out_dir)
    expected = answer(query, read_events(data, query), spec)
    if output is None:
        correct, detail = (expected.num_rows == 0), "no output"
    else:
        correct, detail = compare.check(compare.canonical(query, output), expected)
    seconds, latencies = _figures(windows, sources)
    return JobResult(name, spec.events, seconds, latencies, correct, detail, extra={
        "breakdown": breakdown(windows, latencies),
        "timeline_ms": start_up_timeline(windows, sources, STREAMING_WINDOW_MS),
        "offered_events_per_second": events_per_second,
        "streaming_windows": len(windows.end_ms["events"]),
        "wall_seconds_with_startup": round(wall_s, 1),
        "system_returned_at": returned_at})
