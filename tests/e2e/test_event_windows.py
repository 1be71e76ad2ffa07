"""Event-time windows end to end: out-of-order events in Parquet files, a ParquetSource that
sends watermarks, EventTimeWindows in Spark in another container, exactly-once file sinks
for the results and for the late rows. The published windows equal a plain-Python
reference, every row beyond the lateness is on the late port (through both drivers of
the window engine: the local runner and real containers), and the same holds with
containers SIGKILLed during the run."""

from __future__ import annotations

import collections
import json
import os
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.test_exactly_once import chaos_seed, kill_randomly
from tests.e2e.test_recovery import wait_finished
from weir.master.client import WeirClient
from weir.master.server import MasterServer
from weir.operators.app import load_app
from weir.operators.metrics import collect_metrics

pytestmark = pytest.mark.timeout(420)

FILES, ROWS_PER_FILE = 4, 5_000
BASE_MS = 1_600_000_000_000
WINDOW_MS, DELAY_MS = 1_000, 500

APP = """
    import pyarrow as pa
    from weir.operators import Dag
    from weir.operators.library import EventTimeWindows, FileSink, ParquetSource, PostgresSink

    dag = Dag("event-windows", CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=3000,
              CHECKPOINT_WINDOW_COUNT=4, STATE_DIR={state!r}, SPARK_MASTER="local[1]",
              SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=0, MAX_RESTARTS=8)
    source = dag.add_operator("source", ParquetSource({inbox!r}, rows_per_window=400{text}),
                              CONTAINER=0, EVENT_TIME_COLUMN="ts",
                              WATERMARK_DELAY_MILLIS={delay})
    windows = dag.add_operator("per-second", {windows}, keys="user",
        allowed_lateness_ms={lateness},
        aggregations={{"n": "count(*)", "total": "sum(amount)"}}), CONTAINER=1)
    out = dag.add_operator("out", {sink}, CONTAINER=1)
    late = dag.add_operator("late", FileSink({late!r}, format="parquet", exactly_once=True),
                            CONTAINER=0)
    dag.add_stream("events", source.output, windows.input)
    dag.add_stream("results", windows.output, out.input)
    dag.add_stream("too-late", windows.late, late.input)
"""

Window = tuple[str, int]  # user, window start (epoch ms)
Row = tuple[int, int, str, int, bool]  # id, event ms, user, amount, 6 s behind
KINDS = {
    "tumbling": f"EventTimeWindows.tumbling('ts', size_ms={WINDOW_MS}",
    "sliding": f"EventTimeWindows.sliding('ts', size_ms={WINDOW_MS}, slide_ms=500",
    "session": "EventTimeWindows.session('ts', gap_ms=2",
}


JSON_SCHEMA = "pa.schema([('ts', pa.timestamp('ms')), ('user', pa.string()), " \
    "('amount', pa.int64()), ('id', pa.int64())])"


def as_json_lines(inbox: Path) -> None:
    """The inbox's Parquet files as JSON-lines files (ISO-8601 times), renamed into place."""
    for path in sorted(inbox.glob("part-*.parquet")):
        lines = [json.dumps({**row, "ts": row["ts"].isoformat(timespec="milliseconds")})
                 for row in pq.read_table(path).to_pylist()]
        temp = inbox / f".{path.stem}.tmp"
        temp.write_text("\n".join(lines) + "\n")
        os.replace(temp, inbox / f"{path.stem}.jsonl")
        path.unlink()


def write_inbox(inbox: Path, files: int = FILES) -> list[Row]:
    """Events 1 ms apart, each up to 200 ms out of order (within the watermark delay: never
    late), and one in a hundred 6 s behind: with no lateness always later than its
    windows' end by the watermark before it, however the rows fall into streaming
    windows; with 7 s of lateness always within it (an update of its window)."""
    inbox.mkdir()
    rows: list[Row] = []
    for f in range(files):
        ids = range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        for i in ids:
            very_late = i >= 3_000 and i % 100 == 37
            t = BASE_MS + i - 6_000 if very_late else BASE_MS + i + (i * 7919 % 401 - 200)
            rows.append((i, t, f"u{i % 3}", i % 7, very_late))
        part = rows[-ROWS_PER_FILE:]
        table = pa.table({"ts": pa.array([r[1] for r in part], pa.timestamp("ms")),
                          "user": [r[2] for r in part],
                          "amount": pa.array([r[3] for r in part], pa.int64()),
                          "id": pa.array(ids, pa.int64())})
        pq.write_table(table, inbox / f".part-{f}.tmp", row_group_size=1_000)
        os.replace(inbox / f".part-{f}.tmp", inbox / f"part-{f}.parquet")
    return rows


def reference(rows: list[Row], kind: str, lateness_ms: int
              ) -> tuple[dict[Window, tuple[int, int]], list[int]]:
    """The windows (count, sum) by plain Python, and the ids of the late rows. Whatever
    the kind, a row 6 s behind is late without lateness (its windows, or its session,
    closed long before) and an update with 7 s; no other row is ever late, nor joins a
    window already out."""
    late = [i for i, _, _, _, behind in rows if behind and lateness_ms < 6_000]
    counted = [r for r in rows if not (r[4] and lateness_ms < 6_000)]
    windows: dict[Window, list[int]] = collections.defaultdict(lambda: [0, 0])
    if kind == "session":
        by_user: dict[str, list[Row]] = collections.defaultdict(list)
        for row in counted:
            by_user[row[2]].append(row)
        for user, mine in by_user.items():
            mine.sort(key=lambda r: r[1])
            start = previous = mine[0][1]
            for _, t, _, amount, _ in mine:
                if t - previous >= 2:
                    start = t
                windows[(user, start)][0] += 1
                windows[(user, start)][1] += amount
                previous = t
    else:
        slide = WINDOW_MS if kind == "tumbling" else 500
        for _, t, user, amount, _ in counted:
            last = t - t % slide
            for first in range(last - WINDOW_MS + slide, last + 1, slide):
                windows[(user, first)][0] += 1
                windows[(user, first)][1] += amount
    return {k: (v[0], v[1]) for k, v in windows.items()}, late


def published(folder: Path) -> pa.Table:
    files = sorted(folder.glob("window-*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else pa.table({})


def run(runner, tmp_path: Path, kill: bool, lateness_ms: int = 0, sink: str = "",
        kind: str = "tumbling", files: int = FILES, json_lines: bool = False
        ) -> tuple[dict[Window, tuple[int, int]], dict[str, float]]:
    """Runs the application on ``runner`` (a master, for kills, or fixture ``run_dag``:
    each driver of the window engine in turn); returns the reference windows and the
    windows operator's metrics. Without ``sink`` the results go to an exactly-once
    FileSink and are checked here."""
    expected, late = reference(write_inbox(tmp_path / "inbox", files), kind, lateness_ms)
    if json_lines:
        as_json_lines(tmp_path / "inbox")
    app = tmp_path / "event_windows_app.py"
    out_sink = sink or (f"FileSink({str(tmp_path / 'out')!r}, format='parquet', "
                        "exactly_once=True)")
    app.write_text(textwrap.dedent(APP.format(
        state=str(tmp_path / "state"), inbox=str(tmp_path / "inbox"), sink=out_sink,
        late=str(tmp_path / "late"), delay=DELAY_MS, windows=KINDS[kind],
        lateness=lateness_ms,
        text=f", format='jsonl', file_schema={JSON_SCHEMA}" if json_lines else "")))
    note, kills = "", []
    if isinstance(runner, MasterServer):
        with WeirClient(runner.address) as client:
            app_id = client.submit(load_app(app).to_descriptor())
            if kill:
                rng, note = chaos_seed()
                kills = kill_randomly(runner, client, app_id, note, rng)
            wait_finished(client, runner, app_id, timeout_s=300)
            windows_op = client.operator_stats(app_id, "per-second")
        watermark, metrics = windows_op.watermark_ms, dict(windows_op.metrics)
    else:
        windows_operator = runner(load_app(app)).operator("per-second")
        watermark, metrics = windows_operator.watermark, collect_metrics(windows_operator)
    if kill:
        assert kills, f"no container was killed during the run; {note}"
    assert watermark == 2**63 - 1  # the end of the files closed every window
    late_rows = published(tmp_path / "late")
    assert sorted(late_rows.column("id").to_pylist() if late_rows.num_rows else []) == late
    if sink:
        return expected, metrics
    results = published(tmp_path / "out").to_pylist()
    got = collections.Counter(
        (r["user"], int(r["window_start"].timestamp() * 1000)) for r in results)
    twice = {k: n for k, n in got.items() if n > 1}
    assert not twice, f"windows published more than once ({note}, killed {kills}): {twice}"
    windows = {(r["user"], int(r["window_start"].timestamp() * 1000)): (r["n"], r["total"])
               for r in results}
    wrong = {k: (windows.get(k), v) for k, v in expected.items() if windows.get(k) != v}
    assert not wrong and len(windows) == len(expected), (
        f"{len(wrong)} windows differ from the reference (got, expected), e.g. "
        f"{dict(list(wrong.items())[:5])}; {len(windows)} published of {len(expected)}; "
        f"{note}, killed {kills}")
    said = "its session ended" if kind == "session" else "its windows ended"
    assert all(reason.startswith(f"{said} more than allowed_lateness_ms=0")
               for reason in late_rows.column("late_reason").to_pylist())
    return expected, metrics


@pytest.mark.parametrize("kind", list(KINDS))
def test_event_time_windows_match_the_reference_and_late_rows_are_kept(run_dag, tmp_path,
                                                                        kind):
    run(run_dag, tmp_path, kill=False, kind=kind, files=2)  # kills need the longer run


def test_a_folder_of_json_lines_events_gives_the_same_windows(run_dag, tmp_path):
    """The first pipeline most users write: JSON events in a folder, event time off a
    source column parsed from ISO-8601 text."""
    run(run_dag, tmp_path, kill=False, files=2, json_lines=True)


def test_the_same_with_random_container_sigkills(master, tmp_path):
    run(master, tmp_path, kill=True)


def test_late_updates_reach_postgres_as_upserts_by_key_and_window(run_dag, tmp_path,
                                                                  postgres_dsn):
    """7 s of allowed lateness: the rows 6 s behind update windows already out; the sink
    keeps one row per (user, window), the last version, equal to the reference."""
    import psycopg

    table = f"per_second_{os.getpid()}_{run_dag.driver}"
    sink = (f"PostgresSink({postgres_dsn!r}, {table!r}, "
            "upsert_keys=['user', 'window_start', 'window_end'])")
    expected, metrics = run(run_dag, tmp_path, kill=False, lateness_ms=7_000, sink=sink,
                            files=2)
    assert metrics["windows_out"] > len(expected), "no window was updated: nothing upserted"
    assert metrics["late_rows"] == 0
    with psycopg.connect(postgres_dsn) as conn:
        rows = conn.execute(f'SELECT "user", window_start, n, total FROM {table}').fetchall()
    got = {(user, int(start.timestamp() * 1000)): (n, total) for user, start, n, total in rows}
    assert len(rows) == len(got) == len(expected)
    assert got == expected
