"""PostgresSink against a real PostgreSQL server, driven through its hooks.

Each test writes its own table; the watermark table is shared, its rows keyed by table.
"""

from __future__ import annotations

import datetime
import decimal
import logging
import math
import os
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from weir.operators.library import PostgresSink
from weir.operators.library.postgres import mask_dsn, postgres_type
from weir.operators.operator import OperatorContext, UnreachableAtStart
from weir.operators.windows import make_window_id
from weir.runtime.operator_state import capture, restore
from weir.storage import Fenced

BASE = 1_700_000_000
REPO = Path(__file__).resolve().parents[2]
WATERMARKS = "weir_sink_watermarks"


def wid(counter: int) -> int:
    return make_window_id(BASE, counter)


@pytest.fixture
def table() -> str:
    return f"weir_test_{uuid.uuid4().hex[:12]}"


def context(operator_id: int = 1, name: str = "pg", state_dir: str = "",
            **attributes: Any) -> OperatorContext:
    return OperatorContext(name=name, operator_id=operator_id, container_id="c0",
                           attributes=attributes, state_dir=state_dir)


def start(dsn: str, table: str, operator_id: int = 1, **kwargs: Any) -> PostgresSink:
    sink = PostgresSink(dsn, table, **kwargs)
    sink.setup(context(operator_id))
    return sink


def write(sink: PostgresSink, window: int, *batches: pa.RecordBatch) -> None:
    sink.begin_window(window)
    for batch in batches:
        sink.process("input", batch)
    sink.end_window()


def ids(*values: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(values, pa.int64()),
                            "label": pa.array([f"row {v}" for v in values])})


def query(dsn: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(statement, params).fetchall()


def execute(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(statement)


def table_ids(dsn: str, table: str) -> list[int]:
    return [r[0] for r in query(dsn, f"SELECT id FROM {table} ORDER BY id")]


def watermark(dsn: str, key: str) -> int | None:
    rows = query(dsn, f"SELECT window_id FROM {WATERMARKS} WHERE sink = %s", (key,))
    return rows[0][0] if rows else None


def test_windows_land_with_their_types(postgres_dsn: str, table: str) -> None:
    utc = datetime.UTC
    first = pa.record_batch({
        "id": pa.array([1, 2, 3], pa.int64()),
        "small": pa.array([7, None, -128], pa.int8()),
        "count": pa.array([10, 20, None], pa.int32()),
        "score": pa.array([1.5, float("nan"), float("inf")], pa.float64()),
        "word": pa.array(['a,"quoted"\nline', "", None]),
        "big_word": pa.array(["x", "y", "z"], pa.large_string()),
        "tag": pa.array(["red", "blue", "red"]).dictionary_encode(),
        "ok": pa.array([True, None, False]),
        "at": pa.array([datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=utc), None,
                        datetime.datetime(1969, 12, 31, tzinfo=utc)], pa.timestamp("us", "UTC")),
        "local": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5), None,
                           datetime.datetime(2000, 1, 1)], pa.timestamp("ms")),
        "day": pa.array([datetime.date(2024, 2, 29), None, datetime.date(1, 1, 1)]),
        "price": pa.array([decimal.Decimal("1.23"), None, decimal.Decimal("-0.01")],
                          pa.decimal128(10, 2)),
    })
    sink = start(postgres_dsn, table)
    write(sink, wid(1), first)
    second = first.slice(0, 1).set_column(0, "id", pa.array([4], pa.int64()))
    write(sink, wid(2), second, first.slice(0, 0),
          second.set_column(0, "id", pa.array([5], pa.int64())))
    write(sink, wid(3))  # an empty window writes nothing, not even the watermark
    sink.teardown()

    types = dict(query(postgres_dsn, "SELECT column_name, data_type FROM "
                       "information_schema.columns WHERE table_name = %s", (table,)))
    assert types == {
        "id": "bigint", "small": "smallint", "count": "integer", "score": "double precision",
        "word": "text", "big_word": "text", "tag": "text", "ok": "boolean",
        "at": "timestamp with time zone", "local": "timestamp without time zone",
        "day": "date", "price": "numeric"}
    rows = query(postgres_dsn, f"SELECT * FROM {table} ORDER BY id")
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5]
    one, two, three = rows[:3]
    assert one[1:] == (7, 10, 1.5, 'a,"quoted"\nline', "x", "red", True,
                       datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=utc),
                       datetime.datetime(2024, 1, 2, 3, 4, 5), datetime.date(2024, 2, 29),
                       decimal.Decimal("1.23"))
    assert math.isnan(two[3]) and two[4] == "" and two[1] is None and two[7] is None
    assert two[8:] == (None, None, None, None)
    assert three[3] == math.inf and three[4] is None and three[2] is None
    assert three[8].astimezone(utc) == datetime.datetime(1969, 12, 31, tzinfo=utc)
    assert three[9:] == (datetime.datetime(2000, 1, 1), datetime.date(1, 1, 1),
                         decimal.Decimal("-0.01"))
    assert rows[3][1:] == rows[4][1:] == one[1:]
    assert watermark(postgres_dsn, sink.sink_key) == wid(2)
    assert (sink.windows_written, sink.rows_written) == (2, 5)


def test_replayed_windows_after_a_restore_are_skipped(postgres_dsn: str, table: str) -> None:
    sink = start(postgres_dsn, table)
    write(sink, wid(1), ids(1, 2))
    checkpoint = capture(sink)  # the state as of window 1, as the runtime saves it
    write(sink, wid(2), ids(3))
    write(sink, wid(3), ids(4, 5))
    sink.teardown()  # the container dies; windows 2 and 3 are in the table

    # the runtime's way back: the deploy payload, the checkpoint over it, setup, replay
    again = restore(pickle.loads(pickle.dumps(PostgresSink(postgres_dsn, table))), checkpoint)
    assert isinstance(again, PostgresSink) and again.windows_written == 1
    again.setup(context(1))
    write(again, wid(2), ids(3))
    write(again, wid(3), ids(4, 5))
    write(again, wid(4), ids(6))
    again.teardown()

    assert table_ids(postgres_dsn, table) == [1, 2, 3, 4, 5, 6]
    assert (again.windows_skipped, again.windows_written) == (2, 2)
    assert watermark(postgres_dsn, again.sink_key) == wid(4)


def test_a_replaced_deployment_cannot_write_once_its_successor_did(postgres_dsn: str,
                                                                   table: str) -> None:
    old = PostgresSink(postgres_dsn, table)
    old.setup(OperatorContext("pg", 1, "c0", {}, generation=1))
    write(old, wid(1), ids(1))
    new = PostgresSink(postgres_dsn, table)
    new.setup(OperatorContext("pg", 1, "c9", {}, generation=2))
    write(new, wid(2), ids(2))
    with pytest.raises(Fenced, match="generation 1 of operator 'pg' is fenced off: "
                                     "generation 2 replaced it"):
        write(old, wid(3), ids(3))  # woken after its successor took over
    write(new, wid(3), ids(3))
    old.teardown()
    new.teardown()
    assert table_ids(postgres_dsn, table) == [1, 2, 3]
    assert query(postgres_dsn, f"SELECT generation FROM {WATERMARKS} WHERE sink = %s",
                 (new.sink_key,)) == [(2,)]


def test_a_live_sink_pickles_without_its_connection(postgres_dsn: str, table: str) -> None:
    sink = start(postgres_dsn, table)
    write(sink, wid(1), ids(1))
    copy = pickle.loads(pickle.dumps(sink))
    sink.teardown()
    assert copy._conn is None and copy.windows_written == 1 and copy.dsn == postgres_dsn


def test_partitions_keep_separate_watermarks(postgres_dsn: str, table: str) -> None:
    one, two = start(postgres_dsn, table, 1), start(postgres_dsn, table, 2)
    assert one.sink_key == f"{table}/pg/1" and two.sink_key == f"{table}/pg/2"
    write(one, wid(1), ids(1, 2))
    write(two, wid(1), ids(10, 20))  # the same window from the other partition
    write(two, wid(2), ids(30))
    assert watermark(postgres_dsn, one.sink_key) == wid(1)
    assert watermark(postgres_dsn, two.sink_key) == wid(2)
    write(one, wid(1), ids(1, 2))  # a replay of partition 1 only
    write(one, wid(2), ids(3))
    one.teardown()
    two.teardown()
    assert table_ids(postgres_dsn, table) == [1, 2, 3, 10, 20, 30]
    assert (one.windows_skipped, two.windows_skipped) == (1, 0)

    named = start(postgres_dsn, table, 1, sink_id="report")  # another app's sink
    assert named.sink_key == f"{table}/report/1"
    write(named, wid(1), ids(100))
    named.teardown()
    assert table_ids(postgres_dsn, table)[-1] == 100


def test_a_window_below_another_runs_watermark_is_skipped_with_a_warning(
        postgres_dsn: str, table: str, caplog: pytest.LogCaptureFixture) -> None:
    first = start(postgres_dsn, table)
    write(first, wid(1), ids(1))
    first.teardown()
    earlier_run = start(postgres_dsn, table)  # same key, a run that started before
    with caplog.at_level(logging.WARNING, logger="weir.operators.library.postgres"):
        write(earlier_run, make_window_id(BASE - 60, 5), ids(2))
    earlier_run.teardown()
    assert table_ids(postgres_dsn, table) == [1]
    assert "another application run" in caplog.text and "sink_id" in caplog.text


def test_an_unreachable_server_fails_setup_clearly() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dsn = f"host=127.0.0.1 port={port} dbname=app user=weir password=hunter2 connect_timeout=3"
    sink = PostgresSink(dsn, "counts")
    with pytest.raises(ConnectionError) as caught:
        sink.setup(context(name="report"))
    message = str(caught.value)
    assert "'report'" in message and f"port={port}" in message and "127.0.0.1" in message
    assert "password=***" in message and "hunter2" not in message
    assert "server is running" in message
    assert isinstance(caught.value, UnreachableAtStart)  # a first deployment: fatal
    with pytest.raises(ConnectionError) as caught:  # after a checkpoint restarts wait for it
        PostgresSink(dsn, "counts").setup(OperatorContext(
            name="report", operator_id=1, container_id="c0", attributes={},
            recovered_window=7))
    assert not isinstance(caught.value, UnreachableAtStart)


def test_mask_dsn_hides_passwords() -> None:
    assert mask_dsn(r"host=a password='it\'s secret' user=b") == "host=a password=*** user=b"
    assert mask_dsn("postgres://u:p%40ss@h/db?password=x&sslmode=require") == \
        "postgres://u:***@h/db?password=***&sslmode=require"
    assert mask_dsn("host=a user=b") == "host=a user=b"


def test_an_unsupported_column_type_is_a_clear_error(postgres_dsn: str, table: str) -> None:
    sink = start(postgres_dsn, table)
    batch = pa.record_batch({"id": pa.array([1], pa.int64()),
                             "tags": pa.array([["a", "b"]], pa.list_(pa.string()))})
    with pytest.raises(TypeError, match=r"'pg'.*column 'tags' has Arrow type list<item: "
                                        r"string>.*cast or drop"):
        write(sink, wid(1), batch)
    sink.teardown()
    assert query(postgres_dsn, "SELECT to_regclass(%s)", (table,)) == [(None,)]
    with pytest.raises(TypeError, match="'blob'"):
        postgres_type(pa.field("blob", pa.binary()))


def test_a_missing_table_without_create_table_is_a_clear_error(
        postgres_dsn: str, table: str) -> None:
    sink = start(postgres_dsn, table, create_table=False)
    with pytest.raises(RuntimeError, match=f"table '{table}' does not exist.*create_table"):
        write(sink, wid(1), ids(1))
    sink.teardown()
    execute(postgres_dsn, f"CREATE TABLE {table} (id BIGINT, label TEXT, extra TEXT)")
    sink = start(postgres_dsn, table, create_table=False)
    write(sink, wid(1), ids(1))
    sink.teardown()
    assert query(postgres_dsn, f"SELECT * FROM {table}") == [(1, "row 1", None)]


CRASHING_WRITER = textwrap.dedent("""
    import sys

    import pyarrow as pa

    from weir.operators.library import PostgresSink
    from weir.operators.operator import OperatorContext

    dsn, table, state_dir, window = sys.argv[1:5]
    sink = PostgresSink(dsn, table)
    sink.setup(OperatorContext("pg", 7, "c0", {"CRASH_AT": "postgres.before_commit"},
                               state_dir=state_dir))
    sink.begin_window(int(window))
    sink.process("input", pa.record_batch({"id": pa.array([1, 2, 3], pa.int64())}))
    sink.end_window()
    print("survived the crash point")
""")


def test_a_crash_before_commit_writes_nothing_and_the_retry_writes_once(
        postgres_dsn: str, table: str, tmp_path: Path) -> None:
    script = tmp_path / "crashing_writer.py"
    script.write_text(CRASHING_WRITER)
    state_dir = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script), postgres_dsn, table, str(state_dir),
                           str(wid(1))], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    assert "survived" not in done.stdout
    assert (state_dir / "crashed-at-postgres.before_commit").exists()
    key = f"{table}/pg/7"
    assert table_ids(postgres_dsn, table) == []  # the open transaction died with it
    assert watermark(postgres_dsn, key) == -1

    # the recovered operator: same state folder, so the crash point does not fire again
    sink = PostgresSink(postgres_dsn, table)
    sink.setup(context(7, state_dir=str(state_dir), CRASH_AT="postgres.before_commit"))
    batch = pa.record_batch({"id": pa.array([1, 2, 3], pa.int64())})
    write(sink, wid(1), batch)
    write(sink, wid(1), batch)  # and once more, as a later replay would
    sink.teardown()
    assert table_ids(postgres_dsn, table) == [1, 2, 3]
    assert watermark(postgres_dsn, key) == wid(1)
    assert (sink.windows_written, sink.windows_skipped) == (1, 1)


# -- upsert_keys ---------------------------------------------------------------------------
WINDOW_KEYS = ["user", "window_start", "window_end"]


def minutes(*rows: tuple[str, int, int]) -> pa.RecordBatch:
    """Per-minute results as EventTimeWindows emits them: (user, minute, n)."""
    starts = [datetime.datetime(2024, 1, 1, 0, m, tzinfo=datetime.UTC) for _, m, _ in rows]
    return pa.record_batch({
        "user": pa.array([u for u, _, _ in rows]),
        "window_start": pa.array(starts, pa.timestamp("ms", "UTC")),
        "window_end": pa.array([s + datetime.timedelta(minutes=1) for s in starts],
                               pa.timestamp("ms", "UTC")),
        "n": pa.array([n for _, _, n in rows], pa.int64())})


def table_minutes(dsn: str, table: str) -> list[tuple[str, int, int]]:
    return [(u, s.minute, n) for u, s, n in query(
        dsn, f'SELECT "user", window_start, n FROM {table} ORDER BY 1, 2')]


def test_upsert_keeps_the_latest_row_per_key(postgres_dsn: str, table: str) -> None:
    sink = start(postgres_dsn, table, upsert_keys=WINDOW_KEYS)
    write(sink, wid(1), minutes(("a", 0, 3), ("b", 0, 1)))
    # a updated; c new, twice in the window (the later row wins); b's next minute is new
    write(sink, wid(2), minutes(("a", 0, 5), ("c", 0, 2)), minutes(("c", 0, 4), ("b", 1, 1)))
    write(sink, wid(3), minutes(("a", 0, 5)))  # the same result again changes nothing
    sink.teardown()
    assert table_minutes(postgres_dsn, table) == [("a", 0, 5), ("b", 0, 1), ("b", 1, 1),
                                                  ("c", 0, 4)]
    assert (sink.windows_written, sink.rows_written) == (3, 2 + 3 + 1)
    assert watermark(postgres_dsn, sink.sink_key) == wid(3)
    assert query(postgres_dsn, "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                 "WHERE conrelid = %s::regclass AND contype = 'p'", (table,)) == \
        [('PRIMARY KEY ("user", window_start, window_end)',)]


def test_upsert_with_only_key_columns_adds_new_keys(postgres_dsn: str, table: str) -> None:
    sink = start(postgres_dsn, table, upsert_keys=["id"])
    write(sink, wid(1), ids(1, 2).select(["id"]))
    write(sink, wid(2), ids(2, 3, 3).select(["id"]))
    sink.teardown()
    assert table_ids(postgres_dsn, table) == [1, 2, 3]


def test_a_replayed_upsert_window_changes_nothing(postgres_dsn: str, table: str) -> None:
    sink = start(postgres_dsn, table, upsert_keys=WINDOW_KEYS)
    write(sink, wid(1), minutes(("a", 0, 1)))
    checkpoint = capture(sink)
    write(sink, wid(2), minutes(("a", 0, 2), ("b", 0, 1)))
    sink.teardown()

    again = restore(pickle.loads(pickle.dumps(PostgresSink(postgres_dsn, table,
                                                           upsert_keys=WINDOW_KEYS))),
                    checkpoint)
    assert isinstance(again, PostgresSink) and again.upsert_keys == tuple(WINDOW_KEYS)
    again.setup(context(1))
    # window 2 again, even with other values: the watermark row says it is written
    write(again, wid(2), minutes(("a", 0, 9), ("z", 0, 9)))
    write(again, wid(3), minutes(("b", 0, 7)))
    again.teardown()
    assert table_minutes(postgres_dsn, table) == [("a", 0, 2), ("b", 0, 7)]
    assert (again.windows_skipped, again.windows_written) == (1, 2)


def test_upsert_into_a_table_without_a_matching_unique_key_is_refused(
        postgres_dsn: str, table: str) -> None:
    execute(postgres_dsn, f"CREATE TABLE {table} (id BIGINT, label TEXT UNIQUE, note TEXT)")
    execute(postgres_dsn, f"CREATE UNIQUE INDEX ON {table} (id, label)")  # not exactly id
    execute(postgres_dsn, f"CREATE UNIQUE INDEX ON {table} (id) WHERE id > 0")  # partial
    sink = PostgresSink(postgres_dsn, table, upsert_keys=["id"])
    with pytest.raises(RuntimeError) as caught:
        sink.setup(context(name="report"))
    message = str(caught.value)
    assert f"'report': PostgresSink upsert_keys ['id'] need a primary key or unique index " \
           f"on exactly those columns of table '{table}'" in message
    assert "its unique keys are (label), (id, label)" in message
    fix = message.split("add it with: ")[1]
    assert fix == f'ALTER TABLE "{table}" ADD PRIMARY KEY ("id")'
    assert sink._conn is None  # a failed setup closes its connection

    execute(postgres_dsn, fix)  # the statement it gives works, and then so does the sink
    sink = start(postgres_dsn, table, upsert_keys=["id"], create_table=False)
    write(sink, wid(1), ids(1, 2))
    write(sink, wid(2), ids(2).set_column(1, "label", pa.array(["two"])))
    sink.teardown()
    assert query(postgres_dsn, f"SELECT * FROM {table} ORDER BY id") == [
        (1, "row 1", None), (2, "two", None)]


def test_upsert_accepts_a_unique_index_in_any_column_order(postgres_dsn: str,
                                                           table: str) -> None:
    execute(postgres_dsn, f'CREATE TABLE {table} ("user" TEXT, window_start TIMESTAMPTZ, '
                          "window_end TIMESTAMPTZ, n BIGINT, seen TEXT DEFAULT 'kept')")
    execute(postgres_dsn, f'CREATE UNIQUE INDEX ON {table} (window_end, "user", window_start)')
    sink = start(postgres_dsn, table, upsert_keys=WINDOW_KEYS)
    write(sink, wid(1), minutes(("a", 0, 1)))
    write(sink, wid(2), minutes(("a", 0, 2)))
    sink.teardown()
    assert table_minutes(postgres_dsn, table) == [("a", 0, 2)]
    assert query(postgres_dsn, f"SELECT seen FROM {table}") == [("kept",)]


def test_a_table_made_after_setup_without_the_key_is_refused(postgres_dsn: str,
                                                             table: str) -> None:
    sink = start(postgres_dsn, table, upsert_keys=["id"])  # no table yet: fine
    execute(postgres_dsn, f"CREATE TABLE {table} (id BIGINT, label TEXT)")
    with pytest.raises(RuntimeError, match=r"has no primary key or unique index; add it "
                                           rf'with: ALTER TABLE "{table}" ADD PRIMARY KEY'):
        write(sink, wid(1), ids(1))
    sink.teardown()
    assert table_ids(postgres_dsn, table) == []


def test_upsert_keys_missing_from_the_rows_are_a_clear_error(postgres_dsn: str,
                                                             table: str) -> None:
    sink = start(postgres_dsn, table, upsert_keys=["id", "window_start"])
    with pytest.raises(ValueError, match=r"'pg': PostgresSink upsert_keys \['window_start'\] "
                                         r"are not columns of the rows it gets \(columns: "
                                         r"\['id', 'label'\]\)"):
        write(sink, wid(1), ids(1))
    sink.teardown()
    assert query(postgres_dsn, "SELECT to_regclass(%s)", (table,)) == [(None,)]


@pytest.mark.parametrize(("keys", "complaint"), [
    ([], "is empty"),
    (("id", "day", "id"), r"names \['id'\] more than once"),
    (["id", 3], r"non-empty column names \(strings\); got \[3\]"),
    (["id", ""], r"got \[''\]"),
    ("id", r"must be a list of column names, not 'id' \(write \['id'\]\)"),
    ({"id"}, "must be a list of column names"),
])
def test_bad_upsert_keys_fail_at_construction(keys: Any, complaint: str) -> None:
    with pytest.raises(ValueError, match=f"PostgresSink upsert_keys .*{complaint}"):
        PostgresSink("dbname=app", "counts", upsert_keys=keys)
