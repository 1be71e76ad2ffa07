"""Watermarks end to end: a ParquetSource with EVENT_TIME_COLUMN in one container, a
pass-through and a sink in another; the pass-through's watermark (through both drivers)
and the master's figures (in containers) say, window after window, the highest event time
the source had emitted minus the delay, never less than before, and END_OF_TIME once the
files are read. No Spark: pure-Python operators."""

from __future__ import annotations

import itertools
import os
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from weir.master.client import WeirClient
from weir.operators.app import load_app
from weir.operators.watermarks import END_OF_TIME, NO_WATERMARK

pytestmark = pytest.mark.timeout(240)

FILES, ROWS_PER_FILE, ROWS_PER_WINDOW, DELAY_MS = 4, 3_000, 500, 2_000
BASE_MS = 1_600_000_000_000

APP = """
    from weir.operators import Dag, InputPort, Operator, OutputPort
    from weir.operators.library import FileSink, ParquetSource

    class Pass(Operator):
        '''Passes every batch on as it is; keeps (rows so far, watermark) per window.'''
        input = InputPort()
        output = OutputPort()

        def __init__(self):
            self.rows = 0
            self.seen = []

        def process(self, port, batch):
            self.rows += batch.num_rows
            self.output.emit(batch)

        def end_window(self):
            self.seen.append((self.rows, self.watermark))

    dag = Dag("watermarks", CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, CHECKPOINT_WINDOW_COUNT=5, STATE_DIR={state!r})
    source = dag.add_operator("source", ParquetSource({inbox!r}, rows_per_window={per_window},
                                                      batch_rows=250),
                              CONTAINER=0, EVENT_TIME_COLUMN="ts",
                              WATERMARK_DELAY_MILLIS={delay})
    relay = dag.add_operator("relay", Pass(), CONTAINER=1)
    sink = dag.add_operator("sink", FileSink({out!r}, format="parquet"), CONTAINER=1)
    dag.add_stream("events", source.output, relay.input)
    dag.add_stream("passed", relay.output, sink.input)
"""


def write_inbox(inbox: Path) -> list[int]:
    """Parquet files of events 100 ms apart, each up to 3 s early or late (out of order),
    with a millisecond timestamp column; returns the event times in the order they are read."""
    inbox.mkdir()
    times = []
    for f in range(FILES):
        ids = range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        ts = [BASE_MS + 100 * i + (i * 7919 % 61 - 30) * 100 for i in ids]
        table = pa.table({"ts": pa.array(ts, pa.timestamp("ms")),
                          "id": pa.array(ids, pa.int64())})
        pq.write_table(table, inbox / f".part-{f}.tmp", row_group_size=1_000)
        os.replace(inbox / f".part-{f}.tmp", inbox / f"part-{f}.parquet")
        times += ts
    return times


def test_the_watermark_follows_the_event_times_the_source_emitted(run_dag, tmp_path):
    """Through both drivers: the watermark the relay saw at each window's end; in
    containers, the master's figures too, sampled while it runs."""
    times = write_inbox(tmp_path / "inbox")
    highest = list(itertools.accumulate(times, max))  # after n rows: highest[n - 1]

    def expected(rows: int, mark: int) -> bool:
        """Whether ``mark`` is what a window ending after ``rows`` rows may carry."""
        if mark == END_OF_TIME:
            return rows == len(times)
        return mark == (highest[rows - 1] - DELAY_MS if rows else NO_WATERMARK)

    app = tmp_path / "watermarks_app.py"
    app.write_text(textwrap.dedent(APP.format(
        state=str(tmp_path / "state"), inbox=str(tmp_path / "inbox"),
        out=str(tmp_path / "out"), per_window=ROWS_PER_WINDOW, delay=DELAY_MS)))
    seen: dict[str, list[tuple[int, int]]] = {"relay": [], "sink": []}  # (rows, watermark)

    def sample(client: WeirClient, app_id: str) -> None:
        for op in client.operators(app_id):
            if op.name in seen and op.current_window_id >= 0:
                seen[op.name].append((op.total_tuples_processed, op.watermark_ms))

    run = run_dag(load_app(app), during=sample)
    relay = run.operator("relay")
    assert relay.rows == len(times)
    _follows(relay.seen, expected, "the relay's own windows")
    between = {mark for rows, mark in relay.seen if 0 < rows < len(times)
               and mark not in (NO_WATERMARK, END_OF_TIME)}
    assert between, f"no watermark seen while the files were read: {relay.seen}"
    if run.driver == "containers":
        _the_master_figures_follow(run, seen, expected, len(times))


def _follows(marks_by_rows: list[tuple[int, int]], expected, name: str) -> None:
    wrong = [(rows, mark) for rows, mark in marks_by_rows if not expected(rows, mark)]
    assert not wrong, f"{name}: (rows, watermark) other than the source's: {wrong[:5]}"
    marks = [mark for _, mark in marks_by_rows]
    assert marks == sorted(marks), f"{name}: the watermark went backwards: {marks}"


def _the_master_figures_follow(run, seen: dict[str, list[tuple[int, int]]], expected,
                               events: int) -> None:
    with WeirClient(run.master.address) as client:
        final = {op.name: op for op in client.operators(run.app_id)}
        relay = client.operator_stats(run.app_id, "relay")
    for name in seen:
        seen[name].append((final[name].total_tuples_processed, final[name].watermark_ms))
        _follows(seen[name], expected, f"the master's figures of {name}")
        assert seen[name][-1][1] == END_OF_TIME, f"{name} ended at {seen[name][-1]}"
        assert final[name].total_tuples_processed == events
    between = {mark for rows, mark in seen["relay"] if 0 < rows < events
               and mark not in (NO_WATERMARK, END_OF_TIME)}
    assert between, f"no watermark seen while the files were read: {seen['relay']}"
    assert final["source"].watermark_ms == END_OF_TIME
    assert relay.event_time_lag_ms == 0  # after the end there is no lag
