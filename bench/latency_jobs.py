"""The latency row's runs: Weir and Spark Structured Streaming, map or keyed count, fed
by the same paced generator (``bench.latency``'s docstring has the design)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.latency import (
    SCHEMA,
    WEIR,
    LatencySpec,
    check_counts,
    check_map,
    event_batch,
    figures,
    key_names,
    map_batch,
)
from weir.operators import Dag, InputOperator, InputPort, Operator, OutputPort
from weir.operators.library import WindowedCount
from weir.operators.operator import TransientNonState

if TYPE_CHECKING:
    pass

__all__ = ["LatencySink", "MapOperator", "PacedEvents", "build_dag", "run_weir"]

_BATCH_CAP = 65_536


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class PacedEvents(TransientNonState, InputOperator):
    """Emits the events due by now on a ``rate``/s schedule from its first call, each
    stamped with its due time; logs per window ``window_id first_seq n newest_ms start_ms``
    to ``log`` (the count's results carry no creation times)."""

    output = OutputPort(SCHEMA)
    NON_STATE: ClassVar[tuple[str, ...]] = ("_names", "_window", "_first")

    def __init__(self, rate: int, keys: int, total: int, log: str) -> None:
        self.rate, self.keys, self.total, self.log = rate, keys, total, log
        self.start_ms = -1
        self.emitted = 0
        self.reset_non_state()

    def reset_non_state(self) -> None:
        self._names: pa.Array | None = None
        self._window, self._first = -1, 0

    def begin_window(self, window_id: int) -> None:
        self._window, self._first = window_id, self.emitted

    def emit_tuples(self) -> bool:
        now = _now_ms()
        if self.start_ms < 0:
            self.start_ms = now
        due = min(self.total, ((now - self.start_ms + 1) * self.rate + 999) // 1000)
        n = min(due - self.emitted, _BATCH_CAP)
        if n > 0:
            if self._names is None:
                self._names = key_names(self.keys)
            self.output.emit(event_batch(self.emitted, n, self.keys, self.start_ms, self.rate,
                                         self._names))
            self.emitted += n
        return self.emitted < self.total

    def end_window(self) -> None:
        with open(self.log, "a") as log:
            newest = self.start_ms + (self.emitted - 1) * 1000 // self.rate
            log.write(f"{self._window} {self._first} {self.emitted - self._first} {newest} "
                      f"{self.start_ms}\n")


class MapOperator(Operator):
    """A user's stateless Python map: ``map_batch`` on every batch, as it arrives."""

    input = InputPort()
    output = OutputPort()

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        self.output.emit(map_batch(batch))


class LatencySink(TransientNonState, Operator):
    """Stamps each batch with its arrival (wall clock, ms) and the window it is in; keeps
    them in memory and writes them to ``path`` at the end (off the measured path)."""

    input = InputPort()
    NON_STATE: ClassVar[tuple[str, ...]] = ("_tables", "_window")

    def __init__(self, path: str) -> None:
        self.path = path
        self.reset_non_state()

    def reset_non_state(self) -> None:
        self._tables: list[pa.Table] = []
        self._window = -1

    def begin_window(self, window_id: int) -> None:
        self._window = window_id

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        arrival = _now_ms()
        table = pa.Table.from_batches([batch])
        self._tables.append(table.append_column("arrival_ms", pa.array(
            np.full(table.num_rows, arrival, np.int64))).append_column(
            "window", pa.array(np.full(table.num_rows, self._window, np.int64))))

    def teardown(self) -> None:
        if self._tables:
            pq.write_table(pa.concat_tables(self._tables, promote_options="default"),
                           self.path + ".tmp")
            Path(self.path + ".tmp").rename(self.path)


def build_dag(spec: LatencySpec, work: Path) -> Dag:
    """The source alone in container 0; the map or ``WindowedCount`` and the sink in 1."""
    dag = Dag(f"latency-{spec.job}", STREAMING_WINDOW_SIZE_MILLIS=spec.window_ms, CONTAINERS=2,
              HEARTBEAT_INTERVAL_MILLIS=500, SPARK_MASTER="local[2]",
              SPARK_SHUFFLE_PARTITIONS=2, SPARK_DRIVER_MEMORY="1g", SPARK_WARMUP_ROWS=200_000)
    source = dag.add_operator("events", PacedEvents(spec.rate_per_second, spec.keys,
                                                    spec.events, str(work / "source.log")),
                              CONTAINER=0)
    middle = (dag.add_operator("map", MapOperator(), CONTAINER=1) if spec.job == "map" else
              dag.add_operator("aggregate", WindowedCount(key="key", value="value"),
                               CONTAINER=1, APPLICATION_WINDOW_COUNT=spec.app_windows))
    sink = dag.add_operator("sink", LatencySink(str(work / "sink.parquet")), CONTAINER=1)
    dag.add_stream("events", source.output, middle.input)
    dag.add_stream("results", middle.output, sink.input)
    return dag


def _source_log(path: Path) -> tuple[int, dict[int, tuple[int, int, int]]]:
    """The schedule's start (epoch ms) and, per streaming window of the source, its first
    seq, its events and its newest event's creation (ms)."""
    rows = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    windows = {int(w): (int(first), int(n), int(newest)) for w, first, n, newest, _ in rows}
    return (int(rows[0][4]) if rows else 0), windows


def run_weir(spec: LatencySpec, work: Path, timeout_s: float = 600.0) -> dict[str, Any]:
    """The job on a local master with two container processes; figures and the check."""
    from bench.weir_job import _run_app, breakdown

    middle = "map" if spec.job == "map" else "aggregate"
    windows, error, wall_s = _run_app(build_dag(spec, work), work, timeout_s,
                                      ("events", middle, "sink"))
    base = {"system": WEIR, "job": spec.job, "events": spec.events}
    if error:
        return {**base, "correct": False, "detail": error}
    start_ms, log = _source_log(work / "source.log")
    generated = sum(n for _, n, _ in log.values())
    out = pq.read_table(work / "sink.parquet") if (work / "sink.parquet").exists() else None
    if out is None:
        return {**base, "correct": False, "detail": "WRONG: the sink got nothing"}
    if spec.job == "map":
        correct, detail = check_map(out["seq"].to_numpy(), out["mapped"].to_numpy(),
                                    generated, spec.keys)
        created, arrival = out["created_ms"].to_numpy(), out["arrival_ms"].to_numpy()
        counted = np.ones(len(created), np.int64)
    else:
        correct, detail = check_counts(out, generated, spec.keys)
        created, arrival, counted = _count_units(out, log)
    boundary = start_ms + int(spec.warmup_s * 1000)
    figs = figures(created, arrival, counted, boundary)
    latencies = (arrival - created)[created > boundary].tolist()
    return {**base, **figs, "events": generated, "correct": correct, "detail": detail,
            "extra": {"window_ms": spec.window_ms, "app_windows": spec.app_windows,
                      "wall_seconds_with_startup": round(wall_s, 1),
                      "breakdown": breakdown(windows, latencies),
                      "stages": _stages(windows, middle, log)}}


def _count_units(out: pa.Table, log: dict[int, tuple[int, int, int]]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per window result: its newest event's creation (the source's log), its last
    batch's arrival at the sink, and the events it counts."""
    per = out.group_by("window").aggregate([("arrival_ms", "max"), ("count", "sum")])
    units = [(log[w][2], last, n) for w, last, n in zip(
        per["window"].to_pylist(), per["arrival_ms_max"].to_pylist(),
        per["count_sum"].to_pylist(), strict=True) if log.get(w, (0, 0, 0))[1]]
    created, arrival, events = (np.array(column, np.int64) for column in zip(*units, strict=True)) \
        if units else (np.zeros(0, np.int64),) * 3
    return created, arrival, events


def _stages(windows: Any, middle: str, log: dict[int, tuple[int, int, int]]
            ) -> dict[str, float]:
    """Medians over the measured windows of when each operator ended the window, ms after
    the source ended it (the master's window stats): where a window's time goes."""
    src = windows.end_ms["events"]
    out: dict[str, float] = {}
    for name in (middle, "sink"):
        gaps = [windows.end_ms[name][w] - src[w] for w in src if w in windows.end_ms[name]
                and log.get(w, (0, 0, 0))[1]]
        if gaps:
            out[f"{name}_end_after_source_end_p50_ms"] = float(np.median(gaps))
            out[f"{name}_end_after_source_end_p99_ms"] = float(np.percentile(gaps, 99))
    return out
