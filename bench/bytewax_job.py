"""The benchmark job in Bytewax, the Python-native stream processor Weir users would compare."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from bench.common import JobResult, JobSpec, check_totals

__all__ = ["run"]

_SYSTEM = "bytewax"

Row = tuple[str, tuple[int, list[int]]]  # (key, (window id, [count, sum])) out of fold_window


def run(spec: JobSpec, window_ms: int | None = None, poll_rows: int | None = None) -> JobResult:
    """Runs the job as a one-worker Bytewax dataflow (``run_main``); returns its result.

    Untimed: the Arrow batches of ``spec.generator().batches()`` are made up front. Timed:
    an input whose ``next_batch`` turns the next ``poll_rows`` rows of a batch into
    ``(key, value)`` tuples (paced at ``spec.rate_per_second`` if set), a ``fold_window``
    of count and sum per key over a ``TumblingWindower(window_ms)`` on the ``SystemClock``
    (processing time, windows close as time passes), and a sink keeping every
    ``(key, window, count, sum)`` with the time it came out.

    ``poll_rows`` (default ``spec.batch_rows``, one generator batch) is Bytewax's main knob
    here: each poll costs a call into the window logic of every key it holds, so with 10,000
    keys throughput grows with the poll, and so does the time a closing window waits for
    the poll in progress.

    ``seconds`` runs from the first poll of the input to the last result in the sink.
    ``latencies_ms``, per window: the time its last row reached the sink minus its close
    time, ``window start + window_ms``, or the end of the input if earlier (at the end of
    the input the ``SystemClock`` closes every open window at once).
    """
    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.operators.windowing import SystemClock, TumblingWindower, fold_window
    from bytewax.testing import run_main

    window_ms = window_ms or spec.window_ms
    poll_rows = poll_rows or spec.batch_rows
    batches = list(spec.generator().batches())
    marks: dict[str, float] = {}
    rows: list[tuple[float, list[Row]]] = []

    flow = Dataflow("weir_bench")
    events = op.input("events", flow, _source(batches, poll_rows, spec.rate_per_second, marks))
    align_to = datetime.now(UTC)
    windows = fold_window("count_sum", events, SystemClock(),
                          TumblingWindower(length=timedelta(milliseconds=window_ms),
                                           align_to=align_to),
                          builder=_empty, folder=_fold, merger=_merge, ordered=False)
    op.output("out", windows.down, _sink(rows))
    run_main(flow)

    totals: dict[str, list[int]] = {}
    last_out: dict[int, float] = {}
    for out_time, items in rows:
        for key, (window_id, (count, total)) in items:
            acc = totals.setdefault(key, [0, 0])
            acc[0] += count
            acc[1] += total
            last_out[window_id] = out_time
    correct, detail = check_totals({k: (c, s) for k, (c, s) in totals.items()}, spec.expected())
    start_s = align_to.timestamp()
    latencies = [
        (out - min(start_s + (w + 1) * window_ms / 1000, marks["input_end"])) * 1000
        for w, out in sorted(last_out.items())
    ]
    seconds = (rows[-1][0] - marks["first_in"]) if rows else 0.0
    return JobResult(
        system=_SYSTEM, events=spec.events, seconds=seconds, latencies_ms=latencies,
        correct=correct, detail=detail,
        extra={
            "latency": "last row of a window in the sink minus the window's close "
                       "(start + length, or the end of input if earlier)",
            "windows": len(last_out),
            "window_ms": window_ms,
            "rows_out": sum(len(items) for _, items in rows),
            "poll_rows": poll_rows,
            "workers": 1,
            "clock": "SystemClock",
            "bytewax_version": importlib.metadata.version("bytewax"),
        },
    )


def _empty() -> list[int]:
    return [0, 0]


def _fold(acc: list[int], value: int) -> list[int]:
    acc[0] += 1
    acc[1] += value
    return acc


def _merge(a: list[int], b: list[int]) -> list[int]:
    return [a[0] + b[0], a[1] + b[1]]


def _source(batches: list[pa.RecordBatch], poll_rows: int, rate: float | None,
            marks: dict[str, float]) -> Any:
    """A one-partition input yielding ``(key, value)`` tuples, ``poll_rows`` per poll."""
    from bytewax.inputs import DynamicSource, StatelessSourcePartition

    table = pa.Table.from_batches(batches)

    def chunks() -> Any:
        for offset in range(0, table.num_rows, poll_rows):
            part = table.slice(offset, poll_rows)
            yield list(zip(part.column(0).to_pylist(), part.column(1).to_pylist(),
                           strict=True))

    class Partition(StatelessSourcePartition[tuple[str, int]]):
        def __init__(self) -> None:
            self._chunks = chunks()
            self._sent = 0
            self._start = 0.0

        def next_batch(self) -> list[tuple[str, int]]:
            if not self._start:
                self._start = marks["first_in"] = time.time()
            try:
                items = next(self._chunks)
            except StopIteration:
                marks["input_end"] = time.time()
                raise
            self._sent += len(items)
            return items

        def next_awake(self) -> datetime | None:
            if rate is None or not self._start:
                return None
            return datetime.fromtimestamp(self._start + self._sent / rate, UTC)

    class Source(DynamicSource[tuple[str, int]]):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Partition:
            return Partition()

    return Source()


def _sink(rows: list[tuple[float, list[Row]]]) -> Any:
    """A sink keeping each batch of window results with the time it arrived."""
    from bytewax.outputs import DynamicSink, StatelessSinkPartition

    now: Callable[[], float] = time.time

    class Partition(StatelessSinkPartition[Row]):
        def write_batch(self, items: list[Row]) -> None:
            rows.append((now(), items))

    class Sink(DynamicSink[Row]):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Partition:
            return Partition()

    return Sink()


if __name__ == "__main__":
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    print(json.dumps(run(JobSpec(events=size)).to_dict(), indent=2))
