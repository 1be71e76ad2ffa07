"""Watermarks end to end: a ParquetSource with EVENT_TIME_COLUMN in one container, a
pass-through and a sink in another; the master's figures say, window after window, the
highest event time the source had emitted minus the delay, never less than before, and
END_OF_TIME once the files are read. No Spark: pure-Python operators."""

from __future__ import annotations

import itertools
import os
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from master.client import WeirClient
from operators.app import load_app
from operators.watermarks import END_OF_TIME, NO_WATERMARK
from tests.e2e.conftest import container_logs
from tests.e2e.test_recovery import where_it_stands

pytestmark = pytest.mark.timeout(240)

FILES, ROWS_PER_FILE, ROWS_PER_WINDOW, DELAY_MS = 4, 3_000, 500, 2_000
BASE_MS = 1_600_000_000_000

APP = """
    from operators import Dag, InputPort, Operator, OutputPort
    from operators.library import FileSink, ParquetSource

    class Pass(Operator):
        '''Passes every batch on as it is.'''
        input = InputPort()
        output = OutputPort()

        def process(self, port, batch):
            self.output.emit(batch)

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


def test_the_watermark_follows_the_event_times_the_source_emitted(master, tmp_path):
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
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        deadline = time.monotonic() + 180
        while client.application(app_id).state not in ("FINISHED", "FAILED", "KILLED"):
            assert time.monotonic() < deadline, (
                f"not finished after 180 s\n{where_it_stands(client, app_id)}\n"
                f"{container_logs(master)}")
            for op in client.operators(app_id):
                if op.name in seen and op.current_window_id >= 0:
                    seen[op.name].append((op.total_tuples_processed, op.watermark_ms))
            time.sleep(0.05)
        info = client.application(app_id)
        assert info.state == "FINISHED", f"{info.diagnostics}\n{container_logs(master)}"
        final = {op.name: op for op in client.operators(app_id)}
        relay = client.operator_stats(app_id, "relay")
    for name in seen:
        seen[name].append((final[name].total_tuples_processed, final[name].watermark_ms))
        wrong = [(rows, mark) for rows, mark in seen[name] if not expected(rows, mark)]
        assert not wrong, f"{name}: (rows, watermark) other than the source's: {wrong[:5]}"
        marks = [mark for _, mark in seen[name]]
        assert marks == sorted(marks), f"{name}: the watermark went backwards: {marks}"
        assert marks[-1] == END_OF_TIME, f"{name} ended at {marks[-1]}, not END_OF_TIME"
        assert final[name].total_tuples_processed == len(times)
    between = {mark for rows, mark in seen["relay"] if 0 < rows < len(times)
               and mark not in (NO_WATERMARK, END_OF_TIME)}
    assert between, f"no watermark seen while the files were read: {seen['relay']}"
    assert final["source"].watermark_ms == END_OF_TIME
    assert relay.event_time_lag_ms == 0  # after the end there is no lag
