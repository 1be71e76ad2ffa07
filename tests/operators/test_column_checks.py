"""Columns named by operators are checked at submit (``Dag.to_descriptor``) against what the
source feeding them emits, when that is known: a typo fails with the columns there are."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from weir.operators import Dag, DagError
from weir.operators.column_checks import columns_read
from weir.operators.library import (
    EventTimeWindows,
    ParquetSource,
    RunningCount,
    TextFileSource,
    Tokenize,
    WindowedCount,
)
from weir.operators.testing import CollectSink, ListSource

pytestmark = pytest.mark.timeout(60)

SCHEMA = pa.schema([("ts", pa.timestamp("ms")), ("user", pa.string()), ("amount", pa.int64())])


def events(tmp_path) -> str:
    folder = tmp_path / "events"
    folder.mkdir()
    pq.write_table(pa.table({"ts": pa.array([0], pa.timestamp("ms")), "user": ["a"],
                             "amount": [1]}), folder / "part-0.parquet")
    return str(folder)


def windows(source, reader, **attributes) -> Dag:
    dag = Dag("columns")
    src = dag.add_operator("events", source, **attributes)
    op = dag.add_operator("windows", reader)
    sink = dag.add_operator("sink", CollectSink())
    dag.add_stream("rows", src.output, op.input)
    dag.add_stream("out", op.output, sink.input)
    return dag


def test_a_key_the_parquet_files_do_not_have_fails_at_submit_with_did_you_mean(tmp_path):
    bad = EventTimeWindows.tumbling("ts", size_ms=1000, keys="users")
    with pytest.raises(DagError, match=r"operator 'windows': keys names column 'users', which "
                                       r"'events' does not emit \(its columns: \['ts', 'user', "
                                       r"'amount'\]\); did you mean 'user'\?"):
        windows(ParquetSource(events(tmp_path)), bad).to_descriptor()
    good = EventTimeWindows.tumbling("ts", size_ms=1000, keys="user",
                                     aggregations={"total": "sum(amount)"})
    windows(ParquetSource(str(tmp_path / "events")), good).to_descriptor()


def test_the_event_time_column_and_an_aggregations_input_are_checked(tmp_path):
    folder = events(tmp_path)
    ok = EventTimeWindows.tumbling("ts", size_ms=1000, keys="user")
    with pytest.raises(DagError, match=r"operator 'events': EVENT_TIME_COLUMN='time' is not "
                                       r"among the columns it emits"):
        windows(ParquetSource(folder), ok, EVENT_TIME_COLUMN="time").to_descriptor()
    summing = EventTimeWindows.tumbling("ts", size_ms=1000, keys="user",
                                        aggregations={"total": "sum(amont)"})
    with pytest.raises(DagError, match=r"aggregations\['total'\] names column 'amont'.*did "
                                       r"you mean 'amount'"):
        windows(ParquetSource(folder), summing).to_descriptor()
    time_of = EventTimeWindows.tumbling("t", size_ms=1000, keys="user")
    with pytest.raises(DagError, match="event_time names column 't'"):
        windows(ParquetSource(folder), time_of).to_descriptor()


def test_json_lines_with_a_schema_and_declared_schemas_are_known_too(tmp_path):
    (tmp_path / "in").mkdir()
    text = ParquetSource(str(tmp_path / "in"), format="jsonl", file_schema=SCHEMA)
    with pytest.raises(DagError, match="key names column 'usr'"):
        windows(text, WindowedCount(key="usr")).to_descriptor()
    (tmp_path / "book.txt").write_text("a b\n")
    with pytest.raises(DagError, match=r"column names column 'text', which 'events' does not "
                                       r"emit \(its columns: \['line'\]\)"):
        windows(TextFileSource(str(tmp_path / "book.txt")), Tokenize(column="text")
                ).to_descriptor()


def test_what_is_not_known_before_it_runs_is_left_to_the_run(tmp_path):
    assert ParquetSource("s3://lake/events/").emitted_schema() is None  # never asked at submit
    (tmp_path / "empty").mkdir()  # no file yet: nothing to read a schema from
    windows(ParquetSource(str(tmp_path / "empty")), RunningCount(key="nope")).to_descriptor()
    windows(ListSource([[{"x": 1}]]), RunningCount(key="nope")).to_descriptor()  # undeclared
    folder = events(tmp_path)
    windows(ParquetSource(folder, columns=["user"]), RunningCount(key="user")).to_descriptor()
    with pytest.raises(DagError, match=r"its columns: \['user'\]"):  # columns= narrows it
        windows(ParquetSource(folder, columns=["user"]), WindowedCount(key="user",
                                                                       value="amount")
                ).to_descriptor()


def test_columns_read_takes_names_lists_and_simple_aggregations():
    op = EventTimeWindows.tumbling("ts", size_ms=1000, keys=["a", "b"], aggregations={
        "n": "count(*)", "s": "sum(x)", "d": "count(DISTINCT y)", "e": "sum(x * 2)"})
    assert list(columns_read(op)) == [("event_time", "ts"), ("keys", "a"), ("keys", "b"),
                                      ("aggregations['s']", "x"), ("aggregations['d']", "y")]
    assert list(columns_read(WindowedCount(key="k"))) == [("key", "k")]  # value None: none


def summed_locally(total: str) -> Dag:
    """Rows whose columns nothing declares, into per-second windows summing ``total``."""
    dag = Dag("late-check", SPARK_WARMUP_ROWS=0)
    src = dag.add_operator("src", ListSource([[{"ts": 1_000, "user": "a", "amount": 3}]]),
                           EVENT_TIME_COLUMN="ts")
    w = dag.add_operator("w", EventTimeWindows.tumbling(
        "ts", size_ms=1000, keys="user", aggregations={"total": total}))
    sink = dag.add_operator("sink", CollectSink())
    dag.add_stream("rows", src.output, w.input)
    dag.add_stream("out", w.output, sink.input)
    return dag


def test_a_column_named_but_not_in_the_first_batch_fails_before_spark_runs():
    """A source whose columns are not known at submit: the first batch says them, and the
    error names the user's columns, not the window's internal ones."""
    from weir.operators.testing import LocalRunError, run_local

    dag = summed_locally("sum(amont)")
    dag.to_descriptor()  # nothing known at submit
    with pytest.raises(LocalRunError) as failed:
        run_local(dag)
    message = str(failed.value)
    assert ("operator 'w': aggregations['total'] names column 'amont', which its input port "
            "'input' does not have (its columns: ['ts', 'user', 'amount']); did you mean "
            "'amount'?") in message, message
    assert "__weir" not in message and "AnalysisException" not in message


def test_an_expression_spark_cannot_resolve_names_no_internal_column():
    """An aggregation the first batch cannot check (an expression, not f(column)) fails in
    Spark, with Spark's message; Weir's own columns are taken out of it."""
    from weir.operators.testing import LocalRunError, run_local

    dag = summed_locally("sum(amont * 2)")
    with pytest.raises(LocalRunError) as failed:
        run_local(dag)
    message = str(failed.value)
    assert "`amont` cannot be resolved" in message and "`user`" in message, message
    assert "__weir" not in message, message


def test_a_columns_read_that_names_no_attribute_or_a_wrong_kind_is_refused():
    """A COLUMNS_READ that could check nothing would silently do nothing: refused."""
    from weir.operators import InputPort, Operator

    class Misnamed(Operator):
        input = InputPort()
        COLUMNS_READ = ("keycol",)

        def __init__(self) -> None:
            self.key = "user"

    class Numbered(Operator):
        input = InputPort()
        COLUMNS_READ = ("key",)

        def __init__(self) -> None:
            self.key = 3

    for reader, fragment in ((Misnamed(), "COLUMNS_READ lists 'keycol', which is not an "
                                          "attribute of Misnamed"),
                             (Numbered(), "COLUMNS_READ lists 'key', which holds 3")):
        dag = Dag("declared")
        src = dag.add_operator("src", ListSource([[{"user": "a"}]]))  # columns unknown
        op = dag.add_operator("reader", reader)
        dag.add_stream("rows", src.output, op.input)
        with pytest.raises(DagError, match=f"operator 'reader': {fragment}"):
            dag.to_descriptor()
