"""Unifiers: the default concatenates partitions' windows through the real window loop
(its input ports are not declared), WindowedCount's adds partial counts up in Spark."""

from __future__ import annotations

import collections

import pyarrow as pa

from tests.container.test_window_loop import run, stream
from tests.operators.test_spark import run_window, start
from weir.container.runner_phase import RunnerState
from weir.container.stream_messages import Kind
from weir.operators.library import WindowedCount, WindowedCountUnifier
from weir.operators.unifiers import ConcatUnifier, unifier_input


def test_the_default_unifier_concatenates_each_window_of_every_partition():
    inputs = {unifier_input(0): stream({1: [[1, 2]], 2: [[3]]}),
              unifier_input(1): stream({1: [[10]], 2: []}),
              unifier_input(2): stream({1: [], 2: [[20, 30]]})}
    runner, out = run(ConcatUnifier(), inputs)
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert [(w, sorted(xs)) for w, xs in out.windows()] == [(1, [1, 2, 10]),
                                                            (2, [3, 20, 30])]
    assert out.messages[-1].kind == Kind.END_STREAM


def test_windowed_count_supplies_a_unifier_that_sums_partial_counts(bridge):
    unifier = WindowedCount(key="word", value="v").unifier()
    assert isinstance(unifier, WindowedCountUnifier)
    assert unifier.unifier() is None
    emitted = start(unifier, bridge, name="count#unifier")

    def partial(words: list[str], counts: list[int], window: int) -> pa.RecordBatch:
        return pa.record_batch({"word": words, "count": pa.array(counts, pa.int64()),
                                "sum": pa.array([c * 10 for c in counts], pa.int64()),
                                "window_id": pa.array([window] * len(words), pa.int64())})

    run_window(unifier, 7, {unifier_input(0): [partial(["a", "b"], [1, 2], 7)],
                            unifier_input(1): [partial(["a", "c"], [4, 1], 7)],
                            unifier_input(2): [partial(["b"], [5], 5)]})
    rows = emitted.rows()
    assert sorted((r["word"], r["count"], r["sum"], r["window_id"]) for r in rows) == [
        ("a", 5, 50, 7), ("b", 2, 20, 7), ("b", 5, 50, 5), ("c", 1, 10, 7)]
    assert emitted.batches["output"][0].schema.names == ["word", "count", "sum", "window_id"]
    assert collections.Counter(r["word"] for r in rows)["a"] == 1
