"""The local runner (``runtime.local.run``): exact rows per window, application windows,
Spark, recovery from its checkpoints, watermarks, and errors that name the operator.

Tests taking ``run_dag`` run their DAG through both drivers of the window engine (the
local runner, then real containers; ``tests/drivers.py``) and expect the same."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.drivers import RunFailed
from weir.operators import Dag, InputPort, Operator, OutputPort
from weir.operators.dag import DagError
from weir.operators.library import EventTimeWindows, RunningCount
from weir.operators.spark import SparkSql
from weir.operators.testing import CollectSink, ListSource, LocalRunError, run_local
from weir.operators.windows import window_base_seconds, window_counter

NUMBERS = [[{"x": 1}, {"x": 2}], [{"x": 3}], [], [{"x": 4}], [{"x": 5}]]


class Doubler(Operator):
    input = InputPort(pa.schema([("x", pa.int64())]))
    output = OutputPort()

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        self.output.emit(batch.set_column(0, "x", pc.multiply(batch.column(0), 2)))


class WindowSum(Operator):
    """Emits, at each application window's end, the sum of its rows and the running total."""

    input = InputPort()
    output = OutputPort()

    def __init__(self) -> None:
        self.total = 0
        self.window_sum = 0

    def begin_window(self, window_id: int) -> None:
        self.window_sum = 0

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        self.window_sum += pc.sum(batch.column("x")).as_py() or 0

    def end_window(self) -> None:
        self.total += self.window_sum
        self.output.emit(pa.record_batch({"sum": [self.window_sum], "total": [self.total]}))


class Boom(Operator):
    input = InputPort()

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        raise ValueError("bad row")


def pipeline(middle: Operator, windows: list, **attributes: object) -> Dag:
    dag = Dag("local", **attributes)
    src = dag.add_operator("src", ListSource(windows))
    op = dag.add_operator("op", middle)
    sink = dag.add_operator("sink", CollectSink())
    dag.add_stream("in", src.output, op.input)
    dag.add_stream("out", op.output, sink.input)
    return dag


def by_counter(windows: dict[int, list]) -> dict[int, list]:
    return {window_counter(w): rows for w, rows in windows.items()}


def test_rows_per_window_are_exact_through_both_drivers(run_dag):
    run = run_dag(pipeline(Doubler(), NUMBERS))
    assert run.windows("sink") == {0: [{"x": 2}, {"x": 4}], 1: [{"x": 6}], 2: [],
                                   3: [{"x": 8}], 4: [{"x": 10}]}


def test_a_local_run_says_what_it_ran_and_leaves_the_dag_untouched():
    dag = pipeline(Doubler(), NUMBERS)
    run = run_local(dag)
    assert run.finished and run.sinks == ("sink",) and run.resumed_from == -1
    assert list(run.windows("sink").values()) == [
        [{"x": 2}, {"x": 4}], [{"x": 6}], [], [{"x": 8}], [{"x": 10}]]
    assert [window_counter(w) for w in run.window_ids] == [0, 1, 2, 3, 4]
    assert run.rows("sink") == run.operator("sink").rows()  # the sink's own contents
    assert run.table("sink").column("x").to_pylist() == [2, 4, 6, 8, 10]
    assert dag._operators["sink"].rows() == []  # the DAG's instance never ran
    with pytest.raises(KeyError, match="not a sink"):
        run.rows("op")


def test_application_windows_run_the_logic_once_per_two_windows_and_flush_at_the_end(
        run_dag):
    dag = pipeline(WindowSum(), NUMBERS)
    dag.set_operator_attributes("op", APPLICATION_WINDOW_COUNT=2)
    run = run_dag(dag)
    outputs = {c: rows for c, rows in run.windows("sink").items() if rows}
    if run.first_counter % 2 == 0:
        # windows 0+1 and 2+3 end at 1 and 3; window 4's application window is flushed
        # in window 5, after the stream ended
        assert outputs == {1: [{"sum": 6, "total": 6}], 3: [{"sum": 4, "total": 10}],
                           5: [{"sum": 5, "total": 15}]}
    else:  # application windows end where the window counter does: the first is 1 long
        assert outputs == {0: [{"sum": 3, "total": 3}], 2: [{"sum": 3, "total": 6}],
                           4: [{"sum": 9, "total": 15}]}


def test_max_windows_ends_an_unbounded_source():
    run = run_local(pipeline(Doubler(), NUMBERS * 3), max_windows=2)
    assert run.finished
    assert run.rows("sink") == [{"x": 2}, {"x": 4}, {"x": 6}]


def test_recovery_resumes_from_the_checkpoint_and_replays_the_windows_after_it(tmp_path):
    windows = [[{"x": i}] for i in range(1, 9)]
    clean = by_counter(run_local(pipeline(WindowSum(), windows)).windows("sink"))
    dag = pipeline(WindowSum(), windows, CHECKPOINT_WINDOW_COUNT=2)
    crashed = run_local(dag, stop_after_window=5, checkpoint_dir=str(tmp_path))
    assert not crashed.finished and len(crashed.window_ids) == 5
    assert by_counter(crashed.windows("sink")) == {c: clean[c] for c in range(5)}

    resumed = run_local(dag, checkpoint_dir=str(tmp_path))
    assert resumed.finished
    assert window_counter(resumed.resumed_from) == 3  # checkpoints after windows 1 and 3
    assert {window_base_seconds(w) for w in resumed.window_ids} == {
        window_base_seconds(crashed.window_ids[0])}
    replayed = by_counter(resumed.windows("sink"))
    assert min(replayed) == 4  # window 4 ran before the crash and runs again
    assert replayed == {c: rows for c, rows in clean.items() if c >= 4}
    assert resumed.operator("op").total == sum(range(1, 9))


def boom_dag() -> Dag:
    dag = Dag("boom")
    src = dag.add_operator("src", ListSource([[{"x": 1}]]))
    boom = dag.add_operator("boom", Boom())
    dag.add_stream("in", src.output, boom.input)
    return dag


def test_an_operator_that_raises_fails_the_run_through_both_drivers(run_dag):
    with pytest.raises(RunFailed, match=r"boom.*ValueError: bad row"):
        run_dag(boom_dag())


def test_an_operator_that_raises_is_named_with_its_window():
    with pytest.raises(LocalRunError, match=r"operator 'boom' \(Boom\) failed in window "
                                            r"\d+:0: ValueError: bad row"):
        run_local(boom_dag())


def test_a_malformed_dag_fails_before_anything_runs(run_dag):
    dag = Dag("broken")
    dag.add_operator("src", ListSource([[{"x": 1}]]))
    dag.add_operator("double", Doubler())
    with pytest.raises((DagError, RunFailed), match="double.input is not connected"):
        run_dag(dag)


class Picky(Doubler):
    """Doubles its batch, but refuses a batch holding an odd number above 2."""

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        odd = [x for x in batch.column(0).to_pylist() if x > 2 and x % 2]
        if odd:
            raise ValueError(f"{odd[0]} is odd")
        super().process(port, batch)


def test_dead_letters_of_a_python_operator_leave_on_its_errors_port_in_both_drivers(run_dag):
    dag = pipeline(Picky(), [[{"x": 1}, {"x": 2}, {"x": 3}, {"x": 4}], [{"x": 5}]])
    dag.set_operator_attributes("op", ON_ERROR="DEAD_LETTER")
    bad = dag.add_operator("bad", CollectSink())
    dag.add_stream("errors", dag._operators["op"].errors, bad.input)
    run = run_dag(dag)
    assert [r["x"] for r in run.rows("sink")] == [2, 4, 8]
    assert [(r["x"], r["weir_error"], r["weir_operator"]) for r in run.rows("bad")] == [
        (3, "ValueError: 3 is odd", "op"), (5, "ValueError: 5 is odd", "op")]
    assert run.operator("op").__dict__["_weir_dead_letters"] == 2


def test_a_dag_without_spark_never_imports_pyspark():
    code = ("import sys\n"
            "from tests.operators.test_local_run import NUMBERS, Doubler, pipeline\n"
            "from weir.operators.testing import run_local\n"
            "assert len(run_local(pipeline(Doubler(), NUMBERS)).rows('sink')) == 5\n"
            "assert 'pyspark' not in sys.modules, 'pyspark was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parents[2])


# -- Spark -----------------------------------------------------------------------------
WORDS = [[{"word": w} for w in line.split()] for line in ["a b a", "c", "b b a"]]


def test_a_spark_sql_operator_counts_each_window(run_dag):
    query = "SELECT word, count(*) AS n FROM input GROUP BY word ORDER BY word"
    run = run_dag(pipeline(SparkSql(query), WORDS))
    assert list(run.windows("sink").values()) == [
        [{"word": "a", "n": 2}, {"word": "b", "n": 1}], [{"word": "c", "n": 1}],
        [{"word": "a", "n": 1}, {"word": "b", "n": 2}]]


def test_running_count_recovers_its_store_from_the_checkpoint(tmp_path):
    words = WORDS * 3
    dag = pipeline(RunningCount(key="word"), words, CHECKPOINT_WINDOW_COUNT=2)
    assert not run_local(dag, stop_after_window=6, checkpoint_dir=str(tmp_path)).finished
    resumed = run_local(dag, checkpoint_dir=str(tmp_path))
    assert window_counter(resumed.resumed_from) == 5
    final = {row["word"]: row["count"] for row in resumed.rows("sink")}
    assert final == collections.Counter(r["word"] for rows in words for r in rows)


def test_watermarks_close_event_time_windows_as_the_source_moves_on(run_dag):
    ts = pa.schema([("ts", pa.timestamp("ms"))])
    chunks = [[100, 500], [1_200], [2_500], [2_600]]
    windows = [pa.record_batch([pa.array(c, pa.timestamp("ms"))], schema=ts) for c in chunks]
    dag = Dag("event-time")
    src = dag.add_operator("src", ListSource(windows), EVENT_TIME_COLUMN="ts")
    per_second = dag.add_operator("per_second", EventTimeWindows.tumbling("ts", size_ms=1_000))
    sink = dag.add_operator("sink", CollectSink())
    dag.add_stream("events", src.output, per_second.input)
    dag.add_stream("results", per_second.output, sink.input)
    run = run_dag(dag)
    out = {c: [(int(r["window_start"].timestamp() * 1000), r["count"]) for r in rows]
           for c, rows in run.windows("sink").items()}
    # [0, 1 s) closes when 1.2 s is seen, [1 s, 2 s) at 2.5 s, [2 s, 3 s) at the end
    assert out == {0: [], 1: [(0, 2)], 2: [(1_000, 1)], 3: [(2_000, 2)]}
