"""Dead letters, the parts without processes: bisection, its circuit breaker, the rows'
columns, DAG checks, and local runs."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tests.drivers import RunFailed
from weir.container.operator_errors import describe_error, is_fatal
from weir.operators import Dag
from weir.operators.dag import DagError
from weir.operators.dead_letters import TooManyDeadLetters, error_columns, isolate_failures
from weir.operators.operator import Operator
from weir.operators.ports import InputPort, OutputPort
from weir.operators.testing import CollectSink, ListSource


class RowError(ValueError):
    pass


def failing_on(bad: set[int], tries: list[tuple[int, int]] | None = None):
    def attempt(lo: int, hi: int) -> None:
        if tries is not None:
            tries.append((lo, hi))
        hit = sorted(bad.intersection(range(lo, hi)))
        if hit:
            raise RowError(f"row {hit[0]}")
    return attempt


def is_row_error(exc: BaseException) -> bool:
    return isinstance(exc, RowError)


def test_bisection_finds_exactly_the_rows_that_fail_in_few_tries():
    tries: list[tuple[int, int]] = []
    bad = isolate_failures(100_000, failing_on({7, 50_000, 99_999}, tries), is_row_error)
    assert [(lo, hi, str(exc)) for lo, hi, exc in bad] == [
        (7, 8, "row 7"), (50_000, 50_001, "row 50000"), (99_999, 100_000, "row 99999")]
    assert len(tries) < 3 * 2 * 17 + 1  # about 2 k log2(n): 17 halvings per bad row


def test_every_good_row_is_tried_and_passes_exactly_once():
    passed: list[int] = []

    def attempt(lo: int, hi: int) -> None:
        failing_on({3, 4, 11})(lo, hi)
        passed.extend(range(lo, hi))

    isolate_failures(16, attempt, is_row_error)
    assert sorted(passed) == [r for r in range(16) if r not in (3, 4, 11)]


def test_an_error_that_is_not_the_rows_fault_is_raised_at_once():
    def attempt(lo: int, hi: int) -> None:
        if hi - lo < 4:
            raise ConnectionError("lost")
        raise RowError("row")

    with pytest.raises(ConnectionError):
        isolate_failures(8, attempt, is_row_error)


def test_rows_that_fail_only_together_are_reported_together_when_asked():
    def attempt(lo: int, hi: int) -> None:  # rows 1 and 6 fail only in the same try
        if lo <= 1 < hi and lo <= 6 < hi:
            raise RowError("together")

    assert isolate_failures(8, attempt, is_row_error) == []  # the halves passed: done
    together = isolate_failures(8, attempt, is_row_error, together_is_failure=True)
    assert [(lo, hi) for lo, hi, _ in together] == [(0, 8)]


def test_no_rows_means_the_error_is_the_operators_own():
    with pytest.raises(RowError):
        isolate_failures(0, _always_fails, is_row_error)
    with pytest.raises(KeyError):
        isolate_failures(0, _always_fails, is_row_error, whole_error=KeyError("known"))


def _always_fails(lo: int, hi: int) -> None:
    raise RowError("always")


def test_a_dead_letter_keeps_the_row_and_says_what_where_and_when():
    table = error_columns(pa.record_batch({"id": [5], "word": ["x"]}),
                          ValueError("bad id 5\nplan: ..."), "parse", "input", 42)
    assert table.to_pylist() == [{"id": 5, "word": "x", "weir_error": "ValueError: bad id 5",
                                  "weir_operator": "parse", "weir_port": "input",
                                  "weir_window_id": 42}]


class Parse(Operator):
    input = InputPort()
    output = OutputPort()


def dead_letter_dag(connect_errors: bool = True, **attributes) -> Dag:
    dag = Dag("dl")
    src = dag.add_operator("src", ListSource([[{"x": 1}]]))
    parse = dag.add_operator("parse", Parse(), **attributes)
    out = dag.add_operator("out", CollectSink())
    dag.add_stream("rows", src.output, parse.input)
    dag.add_stream("parsed", parse.output, out.input)
    if connect_errors:
        dead = dag.add_operator("dead", CollectSink())
        dag.add_stream("dead", parse.errors, dead.input)
    return dag


def test_a_dag_with_dead_letters_connected_is_valid_and_declares_the_port():
    dag = dead_letter_dag(ON_ERROR="dead_letter")
    dag.validate()
    parse = next(o for o in dag.to_descriptor().operators if o.name == "parse")
    assert [p.name for p in parse.outputs] == ["output", "errors"]
    assert "errors" not in Parse.output_ports()


def test_dead_letters_with_nowhere_to_go_are_refused_at_submit():
    with pytest.raises(DagError, match="'errors' port is not connected, so the rows it "
                                       "fails on would be lost"):
        dead_letter_dag(connect_errors=False, ON_ERROR="DEAD_LETTER").validate()


def test_the_errors_port_of_an_operator_that_fails_on_errors_is_refused():
    with pytest.raises(DagError, match="has ON_ERROR='FAIL': set ON_ERROR='DEAD_LETTER'"):
        dead_letter_dag().validate()


def test_bad_on_error_values_and_sources_and_own_errors_ports_are_refused():
    with pytest.raises(ValueError, match="is not FAIL or DEAD_LETTER"):
        dead_letter_dag(ON_ERROR="skip")
    dag = Dag("dl")
    src = dag.add_operator("src", ListSource([[{"x": 1}]]), ON_ERROR="DEAD_LETTER")
    dag.add_stream("dead", src.errors, dag.add_operator("sink", CollectSink()).input)
    with pytest.raises(DagError, match="applies to operators with input ports"):
        dag.validate()

    class OwnErrors(Parse):
        errors = OutputPort()

    dag = Dag("dl")
    src = dag.add_operator("src", ListSource([[{"x": 1}]]))
    own = dag.add_operator("own", OwnErrors(), ON_ERROR="DEAD_LETTER")
    dag.add_stream("rows", src.output, own.input)
    dag.add_stream("dead", own.errors, dag.add_operator("sink", CollectSink()).input)
    with pytest.raises(DagError, match="declares a port named 'errors'"):
        dag.validate()


# -- the circuit breaker (issue 29, item 8) ---------------------------------------------
def test_past_max_rows_the_breaker_trips_naming_the_first_error_and_bisection_stops():
    tries: list[tuple[int, int]] = []
    with pytest.raises(TooManyDeadLetters, match=r"more than 100 of a batch's 4096 rows fail "
                                                 r"\(DEAD_LETTER_MAX_ROWS=100\), the first "
                                                 r"with RowError: row 0;") as caught:
        isolate_failures(4096, failing_on(set(range(4096)), tries), is_row_error,
                         max_rows=100)
    assert isinstance(caught.value.__cause__, RowError)
    assert len(tries) <= 2 * 101 + 12  # depth first: not 2 x 4096 - 1 tries


def test_up_to_max_rows_bad_rows_are_set_aside():
    bad = isolate_failures(4096, failing_on(set(range(0, 4096, 41))), is_row_error,
                           max_rows=100)
    assert len(bad) == 100


def test_an_error_of_the_operators_own_code_on_every_row_is_a_bug_not_dead_letters():
    def attempt(lo: int, hi: int) -> None:
        raise AttributeError("'Parse' object has no attribute 'lookup'")

    for count in (1, 8):
        with pytest.raises(TooManyDeadLetters, match=rf"every row of a batch \({count}\) "
                           "fails with AttributeError: 'Parse' object has no attribute "
                           "'lookup'; AttributeError on every row is a bug"):
            isolate_failures(count, attempt, lambda exc: True)

    def some_rows(lo: int, hi: int) -> None:  # a null among the rows: their fault
        if lo <= 3 < hi:
            raise AttributeError("'NoneType' object has no attribute 'lower'")

    assert [(lo, hi) for lo, hi, _ in isolate_failures(8, some_rows, lambda exc: True)] == [
        (3, 4)]


def test_the_breaker_error_is_fatal_and_points_at_the_operators_line():
    def attempt(lo: int, hi: int) -> None:
        raise NameError("name 'lookup' is not defined")

    with pytest.raises(TooManyDeadLetters) as caught:
        isolate_failures(2, attempt, lambda exc: True)
    assert is_fatal(caught.value)
    assert describe_error(caught.value).endswith("in attempt)")


class Odd(Parse):
    """Passes even numbers on; fails on a batch holding an odd one."""

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        odd = [x for x in batch.column("x").to_pylist() if x % 2]
        if odd:
            raise ValueError(f"{odd[0]} is odd")
        self.output.emit(batch)


class Buggy(Parse):
    def process(self, port: str, batch: pa.RecordBatch) -> None:
        self.output.emit(self.cache[batch])  # no such attribute: a bug


def chain(first: Operator, rows: list[list[dict]], second: Operator | None = None,
          **attributes) -> Dag:
    """src -> first -> out; first's dead letters -> second (DEAD_LETTER too, if any) -> dead."""
    dag = Dag("dl")
    src = dag.add_operator("src", ListSource(rows))
    op = dag.add_operator("op", first, ON_ERROR="DEAD_LETTER", **attributes)
    dag.add_stream("rows", src.output, op.input)
    dag.add_stream("out", op.output, dag.add_operator("out", CollectSink()).input)
    errors = op.errors
    if second is not None:
        again = dag.add_operator("again", second, ON_ERROR="DEAD_LETTER")
        dag.add_stream("errors", op.errors, again.input)
        dag.add_stream("kept", again.output, dag.add_operator("kept", CollectSink()).input)
        errors = again.errors
    dag.add_stream("dead", errors, dag.add_operator("dead", CollectSink()).input)
    return dag


def test_dead_letter_max_rows_takes_effect(run_dag):
    rows = [[{"x": x} for x in range(10)]]  # 5 odd rows in one batch
    run = run_dag(chain(Odd(), rows, DEAD_LETTER_MAX_ROWS=5))
    assert [r["x"] for r in run.rows("dead")] == [1, 3, 5, 7, 9]
    with pytest.raises(RunFailed, match=r"TooManyDeadLetters: more than 4 of a batch's 10 "
                                        r"rows fail \(DEAD_LETTER_MAX_ROWS=4\), the first "
                                        "with ValueError: 1 is odd"):
        run_dag(chain(Odd(), rows, DEAD_LETTER_MAX_ROWS=4))
    with pytest.raises(ValueError, match="DEAD_LETTER_MAX_ROWS=0 is invalid: 0 is outside "
                                         "1..1,000,000"):
        chain(Odd(), rows, DEAD_LETTER_MAX_ROWS=0)


def test_a_bug_on_every_row_fails_the_operator_instead_of_dead_lettering_the_stream(run_dag):
    with pytest.raises(RunFailed, match=r"TooManyDeadLetters: every row of a batch \(3\) "
                                        "fails with AttributeError: Buggy has no port or "
                                        "attribute 'cache'"):
        run_dag(chain(Buggy(), [[{"x": 1}, {"x": 2}, {"x": 3}]]))


# -- a dead letter failing again (issue 29, item 18) ------------------------------------
def test_a_dead_letter_failing_again_gets_the_dead_letter_columns_once():
    first = error_columns(pa.record_batch({"id": [5]}), ValueError("bad id 5"), "parse",
                          "input", 42)
    again = error_columns(first, KeyError("no user 5"), "enrich", "input", 43)
    assert again.schema == first.schema
    assert again.to_pylist() == [{"id": 5, "weir_error": "KeyError: 'no user 5'",
                                  "weir_operator": "enrich", "weir_port": "input",
                                  "weir_window_id": 43}]


class Retry(Parse):
    """Takes dead letters back: passes on those below 5, fails on the others."""

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        if max(batch.column("x").to_pylist()) >= 5:
            raise ValueError("still odd")
        self.output.emit(batch)


def test_rows_failing_in_a_second_dead_letter_operator_keep_one_set_of_columns(run_dag):
    run = run_dag(chain(Odd(), [[{"x": x} for x in range(8)]], Retry()))
    dead = run.table("dead")
    assert dead.column_names == ["x", "weir_error", "weir_operator", "weir_port",
                                 "weir_window_id"]
    assert [(r["x"], r["weir_error"], r["weir_operator"]) for r in dead.to_pylist()] == [
        (5, "ValueError: still odd", "again"), (7, "ValueError: still odd", "again")]
    assert [r["x"] for r in run.rows("kept")] == [1, 3]
