"""SparkSql's projections and filters: the columns they copy bypass Spark, and the results
are what Spark alone gives, window after window (the first window plans, the next ones
hand Spark only the columns the query computes with, and Spark sends back only those it
computed)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from tests.operators.test_spark import start
from weir.operators.spark import SparkSql
from weir.operators.windows import make_window_id
from weir.runtime.spark.bridge import SparkSessionBridge

SCHEMA = pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                    ("date_time", pa.timestamp("ms", tz="UTC")), ("extra", pa.string())])


class Recording:
    """A bridge that records the columns of every window input Spark is handed, and of
    every result it sends back."""

    def __init__(self, bridge: SparkSessionBridge) -> None:
        self.bridge = bridge
        self.handed: list[list[str]] = []
        self.returned: list[list[str]] = []

    def to_arrow(self, df: Any) -> pa.Table:
        table = self.bridge.to_arrow(df)
        self.returned.append(table.column_names)
        return table

    def __getattr__(self, name: str) -> Any:
        return getattr(self.bridge, name)

    def window_input(self, schema: pa.Schema) -> Any:
        self.handed.append(list(schema.names))
        return self.bridge.window_input(schema)


def bids(window: int, n: int = 50) -> pa.RecordBatch:
    ids = range(window * n, (window + 1) * n)
    return pa.RecordBatch.from_pylist([
        {"auction": i % 7, "bidder": i, "price": 100 + i, "date_time": 1_700_000_000_000 + i,
         "extra": f"padding-{i}" * 3} for i in ids], schema=SCHEMA)


def run(bridge: Any, query: str, windows: int = 3, plan: bool = True
        ) -> tuple[SparkSql, list[pa.Table]]:
    """The query over ``windows`` windows of bids (two batches each); each window's
    output as one table. ``plan=False``: as if the first window had found nothing to
    pass through (Spark gets every column)."""
    op = SparkSql(query)
    emitted = start(op, bridge)
    if not plan:
        op._planned = True
    out = []
    for window in range(windows):
        before = len(emitted.batches["output"])
        op.begin_window(make_window_id(1_700_000_000, window))
        whole = bids(window)
        op.process("input", whole.slice(0, 20))
        op.process("input", whole.slice(20))
        op.end_window()
        batches = emitted.batches["output"][before:]
        out.append(pa.Table.from_batches(batches) if batches else None)
    return op, out


@pytest.mark.parametrize(("query", "needed", "carrier", "computed"), [
    ("SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM input",
     ("price",), "auction", ["auction", "price"]),
    ("SELECT auction, price FROM input WHERE auction % 3 = 0", ("auction",), "price",
     ["auction", "price"]),
    ("SELECT bidder AS who, extra, price FROM input WHERE price > 120 AND length(extra) > 0",
     ("price", "extra"), "bidder", ["who", "extra", "price"]),
    ("SELECT * FROM input WHERE bidder % 2 = 1", ("bidder",), "auction",
     ["auction", "bidder"]),
], ids=["map", "filter", "alias", "star"])
def test_copied_columns_bypass_spark_and_the_results_stay_the_same(
        bridge: SparkSessionBridge, query: str, needed: tuple[str, ...], carrier: str,
        computed: list[str]) -> None:
    recording = Recording(bridge)
    op, through = run(recording, query)
    _, plain = run(bridge, query, plan=False)
    assert op._pass_through is not None
    assert (op._pass_through.needed, op._pass_through.carrier) == (needed, carrier)
    # the first window plans with every column; the next ones hand Spark only the
    # needed columns and the carrier of the rows' numbers, and get back only the columns
    # Spark computes (and the carrier's numbers)
    assert recording.handed == [SCHEMA.names, [*needed, carrier], [*needed, carrier]]
    assert recording.returned[1:] == [computed, computed]
    for got, expected in zip(through, plain, strict=True):
        assert got.schema == expected.schema
        assert got.to_pylist() == expected.to_pylist()
    assert through[1].num_rows > 0 and through[2].num_rows > 0


@pytest.mark.parametrize("query", [
    "SELECT auction, count(*) AS n FROM input GROUP BY auction",
    "SELECT auction, price FROM input ORDER BY price DESC",
    "SELECT auction, price FROM input LIMIT 5",
    "SELECT DISTINCT auction, price FROM input",
    "SELECT auction, price, sum(price) OVER (PARTITION BY auction) AS s FROM input",
    "SELECT 2 * price AS price FROM input",  # nothing copied
    "SELECT extra FROM input WHERE price > 3",  # no integer column to carry row numbers
    "SELECT auction AS a, auction AS b, price FROM input WHERE price > 3",
], ids=["group", "order", "limit", "distinct", "window", "computed", "no-carrier", "twice"])
def test_what_is_not_a_projection_or_filter_runs_whole_in_spark(
        bridge: SparkSessionBridge, query: str) -> None:
    recording = Recording(bridge)
    op, out = run(recording, query, windows=2)
    assert op._pass_through is None
    assert recording.handed == [SCHEMA.names, SCHEMA.names]
    _, plain = run(bridge, query, windows=2, plan=False)
    assert [t.to_pylist() for t in out] == [t.to_pylist() for t in plain]


def test_every_row_in_order_is_put_back_without_a_copy() -> None:
    """A map's result carries the rows' numbers 0..n-1: the copied columns go out as the
    input's own buffers; a filter's are taken by the numbers."""
    from weir.operators.spark_passthrough import PassThrough

    rows = pa.Table.from_batches([bids(0)])
    output = SCHEMA.remove(SCHEMA.get_field_index("bidder"))
    through = PassThrough(SCHEMA, {}, {"auction": "auction", "extra": "extra"}, "auction",
                          ("price",), output)
    spark_result = pa.table({"auction": pa.array(range(rows.num_rows), pa.int64()),
                             "price": rows.column("price"), "date_time": rows.column(
                                 "date_time")})
    restored = through.restore(spark_result, rows)
    assert restored.schema == output  # the query's columns, in its order
    assert restored.column("extra").chunk(0).buffers()[2].address == \
        rows.column("extra").chunk(0).buffers()[2].address
    assert restored.column("auction").to_pylist() == rows.column("auction").to_pylist()
    some = through.restore(spark_result.slice(3, 4), rows)
    assert some.column("extra").to_pylist() == rows.column("extra").to_pylist()[3:7]
