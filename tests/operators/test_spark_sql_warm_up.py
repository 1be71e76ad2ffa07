"""SparkSql warms its own query as it activates, before its first window, when its input's
schema is known (the master tells it a source's; or the port declares one): over sample
rows of that schema, round after round until the time settles or SPARK_WARMUP_MILLIS is
spent (at least twice, at most sixteen), every
round after the first in the pass-through's narrow shape, which the real windows keep
while their rows have that schema. Nothing of it is emitted or counted, and a query that
fails on the sample rows is left to the real windows."""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tests.operators.test_spark import Emitted
from tests.operators.test_spark_passthrough import SCHEMA, Recording, bids, run
from weir.operators import Dag, spark_sql
from weir.operators.library import ParquetSource
from weir.operators.operator import OperatorContext
from weir.operators.spark_sql import SparkSql, sample_rows
from weir.operators.windows import make_window_id
from weir.runtime.spark.warm_up import run_until_settled

QUERY = "SELECT auction, bidder, 2 * price AS price, date_time, extra FROM input"


class Counting(Recording):
    """The recording bridge, with its warm-up rows set, also counting jobs."""

    def __init__(self, bridge: Any, warmup_rows: int) -> None:
        super().__init__(bridge)
        self.warmup_rows = warmup_rows
        self.jobs = 0

    def to_arrow(self, df: Any) -> pa.Table:
        self.jobs += 1
        return self.bridge.to_arrow(df)


def _start(op: SparkSql, spark: Any, schemas: dict[str, pa.Schema], *,
           redeployed: bool = False, attributes: dict[str, Any] | None = None) -> Emitted:
    emitted = Emitted()
    op.connect_outputs(emitted)
    context = OperatorContext(name="q", operator_id=1, container_id="c0",
                              attributes=attributes or {}, spark=spark,
                              input_schemas=schemas, redeployed=redeployed)
    op.setup(context)
    assert spark.jobs == 0  # setup() is quick: the sources wait for it
    op.activate(context)
    return emitted


def _never_settling(run_round, **rule):
    """``run_until_settled`` on a clock where each round takes 20 % less time than the one
    before (never settled), a second the first."""
    clock = {"now": 0.0, "round": 1.0}

    def timed_round() -> None:
        run_round()
        clock["now"] += clock["round"]
        clock["round"] *= 0.8

    return run_until_settled(timed_round, clock=lambda: clock["now"], **rule)


def test_a_known_input_schema_warms_the_query_until_settled_and_its_first_window_runs_narrow(
        bridge):
    spark = Counting(bridge, warmup_rows=500)
    op = SparkSql(QUERY)
    emitted = _start(op, spark, {"input": SCHEMA})
    warm_ups = spark.jobs
    assert 2 <= warm_ups <= 16
    assert spark.handed[0] == SCHEMA.names  # then narrow: planned
    assert spark.handed[1:] == [["price", "auction"]] * (warm_ups - 1)
    assert emitted.batches.get("output", []) == []
    assert op.spark_costs() == {} or op.spark_costs()["jobs"] == 0
    assert op._input_schemas == {}
    op.begin_window(make_window_id(1_700_000_000, 0))
    op.process("input", bids(0))
    op.end_window()
    assert spark.handed[warm_ups] == ["price", "auction"]  # the warm-up's plan, not wide
    [out] = emitted.batches["output"]
    _, [plain] = run(bridge, QUERY, windows=1, plan=False)  # Spark with every column
    assert out.schema == plain.schema
    assert out.column("price").to_pylist() == [2 * p for p in bids(0).column("price")
                                                .to_pylist()]
    assert out.column("extra").to_pylist() == bids(0).column("extra").to_pylist()
    assert op.spark_costs()["jobs"] == 1


def test_a_redeployed_operator_warms_two_rounds_only(bridge, monkeypatch):
    monkeypatch.setattr(spark_sql, "run_until_settled", _never_settling)
    first, again = Counting(bridge, warmup_rows=100), Counting(bridge, warmup_rows=100)
    _start(SparkSql(QUERY), first, {"input": SCHEMA}, attributes={"SPARK_WARMUP_MILLIS": 60_000})
    _start(SparkSql(QUERY), again, {"input": SCHEMA}, redeployed=True,
           attributes={"SPARK_WARMUP_MILLIS": 60_000})
    assert (first.jobs, again.jobs) == (16, 2)


def test_spark_warmup_millis_bounds_a_warm_up_that_never_settles(bridge, monkeypatch):
    monkeypatch.setattr(spark_sql, "run_until_settled", _never_settling)
    jobs = {}
    for millis in (0, 2_500, 60_000):
        spark = Counting(bridge, warmup_rows=100)
        _start(SparkSql(QUERY), spark, {"input": SCHEMA},
               attributes={"SPARK_WARMUP_MILLIS": millis})
        jobs[millis] = spark.jobs
    # 0: the two rounds it needs (plan, then the planned shape); 2.5 s: rounds of 1, 0.8
    # and 0.64 s began within it, the next at 2.44 s too; 60 s: all sixteen
    assert jobs == {0: 2, 2_500: 4, 60_000: 16}


def test_real_rows_of_another_schema_than_the_warmed_one_plan_again(bridge):
    spark = Counting(bridge, warmup_rows=500)
    op = SparkSql(QUERY)
    told = SCHEMA.set(2, pa.field("price", pa.int32()))  # the rows will say int64
    emitted = _start(op, spark, {"input": told})
    op.begin_window(make_window_id(1_700_000_000, 0))
    op.process("input", bids(0))
    op.end_window()
    assert spark.handed[-1] == SCHEMA.names  # planned on its own rows, so every column
    [out] = emitted.batches["output"]
    assert out.column("price").to_pylist() == [2 * p for p in bids(0).column("price")
                                                .to_pylist()]


def test_its_own_query_is_warmed_instead_of_the_generic_count_when_it_can_be(bridge):
    class Generic(Counting):
        warmed = 0

        def warm_up(self) -> None:
            self.warmed += 1

    own, unknown = Generic(bridge, warmup_rows=500), Generic(bridge, warmup_rows=500)
    _start(SparkSql(QUERY), own, {"input": SCHEMA})
    _start(SparkSql(QUERY), unknown, {})
    assert (own.jobs > 0, own.warmed) == (True, 0)
    assert (unknown.jobs, unknown.warmed) == (0, 1)  # no schema: the common shape


def test_no_warm_up_without_a_known_schema_or_with_warm_up_rows_off(bridge):
    unknown = Counting(bridge, warmup_rows=500)
    _start(SparkSql(QUERY), unknown, {})
    off = Counting(bridge, warmup_rows=0)
    _start(SparkSql(QUERY), off, {"input": SCHEMA})
    assert unknown.jobs == off.jobs == 0


def test_a_query_failing_on_the_sample_rows_is_left_to_the_real_windows(bridge, caplog):
    caplog.set_level(logging.INFO, logger="weir.operators.spark")
    spark = Counting(bridge, warmup_rows=100)
    op = SparkSql("SELECT auction, 1000 DIV (price - 1) AS q FROM input")  # price 1: / 0
    emitted = _start(op, spark, {"input": SCHEMA})
    assert spark.jobs >= 1 and "could not be warmed" in caplog.text
    op.begin_window(make_window_id(1_700_000_000, 0))
    op.process("input", bids(0))  # prices from 100: no zero
    op.end_window()
    [out] = emitted.batches["output"]
    assert out.num_rows == bids(0).num_rows


def test_sample_rows_fit_every_column_type():
    schema = pa.schema([("i", pa.int32()), ("f", pa.float64()), ("d", pa.decimal128(10, 2)),
                        ("t", pa.timestamp("ms", tz="UTC")), ("s", pa.string()),
                        ("b", pa.bool_()), ("l", pa.list_(pa.int64()))])
    rows = sample_rows(schema, 1000)
    assert rows.schema == schema and rows.num_rows == 1000
    assert rows.column("i").to_pylist()[:8] == [1, 20, 300, 4000, 50_000, 600_000,
                                                7_000_000, 8]  # every magnitude
    assert rows.column("s").to_pylist()[6:8] == ["7000000", "8"]
    assert rows.column("d").to_pylist()[996:998] == [997, 1]  # 10^9 does not fit: 1 to 997
    assert rows.column("l").null_count == 1000


def test_a_parquet_sources_schema_travels_with_its_readers_input(tmp_path):
    pq.write_table(pa.table({"a": [1], "b": ["x"], "c": [1.0]}), tmp_path / "p.parquet")
    dag = Dag("schemas")
    source = dag.add_operator("source", ParquetSource(str(tmp_path), columns=["a", "b"]))
    first = dag.add_operator("first", SparkSql("SELECT a FROM input"))
    second = dag.add_operator("second", SparkSql("SELECT a FROM input"))
    dag.add_stream("s", source.output, first.input)
    dag.add_stream("t", first.output, second.input)
    described = {op.name: op for op in dag.to_descriptor().operators}
    [fed] = described["first"].inputs
    assert pa.ipc.read_schema(pa.py_buffer(fed.stream_schema)).names == ["a", "b"]
    [later] = described["second"].inputs  # what `first` computes is not known before
    assert later.stream_schema == b""
