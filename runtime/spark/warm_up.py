"""The jobs that warm a SparkSession up: grouped aggregations of the common shape, run
until their time settles or a time budget is spent (``SPARK_WARMUP_MILLIS``), so the
first windows do not pay the JVM's cold start.

The first round costs the same whatever its size (measured on this 2-core machine, a
fresh session: 5.1 s for a count of 1,000 rows, 5.5 s for 200,000; the next rounds
0.3-0.6 s): it loads and links Spark's classes for the shape. That round always runs;
the rounds after it only warm the JIT, and stop when the budget is spent, so a busy
machine, on which the rounds never settle, cannot turn the warm-up into minutes.

The jobs are ``WindowedCount``'s own query (its ``transform``), handed over the way a
window's input is (``bridge.window_input``: written as it arrives, then read back), not
a look-alike. Spark compiles each query shape into classes of its own (whole-stage
codegen) that the JIT then warms separately, so a look-alike left the first real window
cold: measured on this 2-core machine, a warm spare's first 500 k-row count after a
recovery took 0.3-0.7 s more than the next ones (its handoff 70-290 ms against 20-90,
its job 520-830 ms against 280-600), on the recovery's critical path.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

    from weir.operators.operator import SparkBridge

__all__ = ["run_until_settled", "run_warm_up_jobs"]

_WINDOW_ID = 0
"""The window id the warm-up's counts are stamped with (a literal, as in every window)."""


def run_warm_up_jobs(bridge: SparkBridge, rows: int, max_rounds: int,
                     budget_s: float | None = None) -> None:
    """Counts ``rows`` rows per key with ``WindowedCount``'s query, by 10,000 string keys
    and by their int32 codes (the layout ``WindowedCount`` hands Spark), round after
    round, until a round is no longer more than 20 % faster than the fastest before it,
    ``max_rounds`` ran, or ``budget_s`` seconds passed (None: no budget). No rows: the
    session starts, and no job runs."""
    import numpy as np
    import pyarrow as pa

    if rows <= 0:
        bridge.session  # noqa: B018 - starting it is the point
        return
    keys = pa.array([f"k{i:04d}" for i in range(10_000)]).take(
        pa.array(np.arange(rows) % 10_000))
    codes = pa.array(np.arange(rows) % 10_000, pa.int32())
    values = pa.array(np.arange(rows))
    batches = [pa.record_batch({"k": keys, "v": values}),
               pa.record_batch({"c": codes, "v": values})]

    def one_round() -> None:
        for batch in batches:
            _count_window(bridge, batch)

    run_until_settled(one_round, max_rounds=max_rounds, patience=1, gain=0.2,
                      budget_s=budget_s)


def run_until_settled(run_round: Callable[[], None], *, max_rounds: int, patience: int,
                      gain: float, min_rounds: int = 1, budget_s: float | None = None,
                      clock: Callable[[], float] = time.perf_counter) -> int:
    """Runs ``run_round`` until ``patience`` rounds in a row were no more than ``gain``
    (a fraction) faster than the fastest round before them (the JIT has compiled what it
    will), or ``budget_s`` seconds passed since the first round began. At least
    ``min_rounds``, at most ``max_rounds``; returns the rounds run."""
    best, flat, rounds = float("inf"), 0, 0
    began = clock()
    while rounds < max_rounds:
        if rounds >= min_rounds and budget_s is not None and clock() - began >= budget_s:
            break
        started = clock()
        run_round()
        took = clock() - started
        rounds += 1
        flat = 0 if took < (1 - gain) * best else flat + 1
        best = min(best, took)
        if flat >= patience and rounds >= min_rounds:
            break
    return rounds


def _count_window(bridge: SparkBridge, batch: pa.RecordBatch) -> None:
    """One window of ``WindowedCount`` over ``batch`` (keyed by its first column, summing
    its second), from the handoff to the Arrow result, as an operator's window runs it."""
    from weir.operators.library.transforms import WindowedCount

    key, value = batch.schema.names
    window_input = bridge.window_input(batch.schema)
    try:
        window_input.append(batch)
        with bridge.job():
            df = window_input.dataframe()
            count = WindowedCount(key=key, value=value)
            bridge.to_arrow(count.transform({"input": df}, _WINDOW_ID))
    finally:
        window_input.discard()
