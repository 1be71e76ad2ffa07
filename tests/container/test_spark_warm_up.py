"""The warm-up runs ``WindowedCount``'s own query, handed over as a window's input is.

Spark compiles each query shape into classes of its own, which the JIT warms separately:
a look-alike query left a warm spare's first real count after a recovery cold (0.3-0.7 s
slower than the next ones, on the recovery's critical path).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from weir.operators.library.transforms import WindowedCount
from weir.runtime.spark.warm_up import run_until_settled, run_warm_up_jobs

pytestmark = pytest.mark.timeout(300)


def test_the_warm_up_counts_with_windowed_counts_query_through_a_window_input(
        fresh_bridge, monkeypatch) -> None:
    handed: list[pa.Schema] = []
    made: list[object] = []
    ran: list[object] = []
    results: list[pa.Table] = []

    window_input = fresh_bridge.window_input

    def spy_window_input(schema: pa.Schema):
        handed.append(schema)
        return window_input(schema)

    transform = WindowedCount.transform

    def spy_transform(self, inputs, window_id):
        df = transform(self, inputs, window_id)
        made.append(df)
        return df

    to_arrow = fresh_bridge.to_arrow

    def spy_to_arrow(df):
        ran.append(df)
        table = to_arrow(df)
        results.append(table)
        return table

    monkeypatch.setattr(fresh_bridge, "window_input", spy_window_input)
    monkeypatch.setattr(WindowedCount, "transform", spy_transform)
    monkeypatch.setattr(fresh_bridge, "to_arrow", spy_to_arrow)
    run_warm_up_jobs(fresh_bridge, rows=20_000, max_rounds=1)

    # string keys and their int32 codes, each with the int64 value summed
    assert [(s.types[0], s.types[1]) for s in handed] == [(pa.string(), pa.int64()),
                                                           (pa.int32(), pa.int64())]
    assert ran and all(any(df is m for m in made) for df in ran)  # only WindowedCount's
    for table in results:  # the counts themselves: 10,000 keys, 2 rows each
        assert table.num_rows == 10_000 and table.column_names[1:] == ["count", "sum",
                                                                        "window_id"]
        assert set(table.column("count").to_pylist()) == {2}


def test_no_warm_up_rows_starts_the_session_and_runs_no_job() -> None:
    """SPARK_WARMUP_ROWS=0: the session starts (operators are ready once it is up) and no
    aggregation runs: the first windows pay the cold JIT instead."""

    class Bridge:
        started = 0

        @property
        def session(self) -> object:
            self.started += 1
            return object()

        def window_input(self, schema: pa.Schema) -> None:
            raise AssertionError("a warm-up job ran")

    bridge = Bridge()
    run_warm_up_jobs(bridge, rows=0, max_rounds=6)
    assert bridge.started == 1


def test_spark_warmup_rows_0_reaches_the_bridge_and_a_negative_count_is_refused() -> None:
    from weir.operators.attributes import resolve
    from weir.runtime.spark.bridge import SparkSessionBridge

    rows = resolve("SPARK_WARMUP_ROWS", {"SPARK_WARMUP_ROWS": "0"})
    bridge = SparkSessionBridge.from_attributes({"SPARK_WARMUP_ROWS": rows})  # no JVM yet
    try:
        assert bridge.warmup_rows == 0
    finally:
        bridge.stop()
    with pytest.raises(ValueError, match="-1 is outside 0"):
        resolve("SPARK_WARMUP_ROWS", {"SPARK_WARMUP_ROWS": "-1"})


def _timed_rounds(times: list[float], **rule: float) -> tuple[int, int]:
    """Runs ``run_until_settled`` over rounds that take ``times`` (a fake clock);
    returns the rounds it ran and the rounds called."""
    clock = {"now": 0.0}
    took = iter(times)
    calls = []

    def one_round() -> None:
        calls.append(1)
        clock["now"] += next(took)

    rounds = run_until_settled(one_round, clock=lambda: clock["now"], **rule)  # type: ignore[arg-type]
    return rounds, len(calls)


def test_warm_up_rounds_go_on_until_their_time_settles() -> None:
    # the q1 warm-up's shape: faster and faster, then flat within 5 % of the best
    times = [1.39, 0.63, 0.40, 0.33, 0.29, 0.225, 0.28, 0.31, 0.26, 0.27, 0.2, 0.2]
    assert _timed_rounds(times, max_rounds=16, patience=4, gain=0.05) == (10, 10)
    # a new fastest round starts the patience again
    assert _timed_rounds([1.0, 0.99, 0.5, 0.49, 0.48, 0.47], max_rounds=16, patience=2,
                         gain=0.05) == (5, 5)
    # never more than max_rounds, never fewer than min_rounds
    assert _timed_rounds([1.0, 0.5, 0.25, 0.12], max_rounds=3, patience=1,
                         gain=0.2) == (3, 3)
    assert _timed_rounds([1.0, 1.0, 1.0], max_rounds=16, patience=1, gain=0.2,
                         min_rounds=3) == (3, 3)
    assert _timed_rounds([1.0, 1.0, 1.0], max_rounds=16, patience=1, gain=0.2) == (2, 2)


def test_a_time_budget_ends_rounds_that_never_settle_after_the_minimum() -> None:
    # a busy machine: every round slower than the best by more than the gain, for ever
    slow = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
    assert _timed_rounds(slow, max_rounds=16, patience=4, gain=0.05, budget_s=2.5) == (3, 3)
    # the minimum runs whatever the budget (the first round loads Spark's classes)
    assert _timed_rounds(slow, max_rounds=16, patience=4, gain=0.05, min_rounds=2,
                         budget_s=0.0) == (2, 2)
    # no budget: as before, up to max_rounds
    assert _timed_rounds(slow, max_rounds=5, patience=4, gain=0.05) == (5, 5)


def test_spark_warmup_millis_reaches_the_bridge_and_bounds_its_warm_up(monkeypatch) -> None:
    from weir.operators.attributes import resolve
    from weir.runtime.spark import bridge as bridge_module
    from weir.runtime.spark.bridge import SparkSessionBridge

    millis = resolve("SPARK_WARMUP_MILLIS", {"SPARK_WARMUP_MILLIS": "250"})
    bridge = SparkSessionBridge.from_attributes({"SPARK_WARMUP_MILLIS": millis})  # no JVM yet
    budgets: list[float | None] = []
    monkeypatch.setattr(bridge_module, "run_warm_up_jobs",
                        lambda _bridge, _rows, _rounds, budget_s: budgets.append(budget_s))
    try:
        bridge.warm_up()
        assert budgets == [0.25] and bridge.warm
    finally:
        bridge.stop()
    spare = SparkSessionBridge.from_attributes({"SPARK_WARMUP_MILLIS": millis})
    try:  # a spare warms off every critical path: unbounded
        spare.warm_up(bounded=False)
        assert budgets == [0.25, None]
    finally:
        spare.stop()
    with pytest.raises(ValueError, match="-1 is outside 0..3,600,000 ms"):
        resolve("SPARK_WARMUP_MILLIS", {"SPARK_WARMUP_MILLIS": "-1"})
