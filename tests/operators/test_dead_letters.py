"""Dead letters, the parts without processes: bisection, the rows' columns, DAG checks."""

from __future__ import annotations

import pyarrow as pa
import pytest

from operators import Dag
from operators.dag import DagError
from operators.dead_letters import error_columns, isolate_failures
from operators.operator import Operator
from operators.ports import InputPort, OutputPort
from operators.testing import CollectSink, ListSource


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
