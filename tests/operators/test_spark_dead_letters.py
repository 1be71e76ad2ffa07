"""Dead letters of Spark window jobs, against a real local Spark: the rows a job fails on
are found by bisection and set aside, the job's result is the one over the other rows,
and an error that is not the rows' fault still fails the operator."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tests.operators.test_spark import Emitted, run_window
from weir.operators import spark_dead_letters
from weir.operators.dead_letters import DeadLetters, TooManyDeadLetters
from weir.operators.operator import OperatorContext
from weir.operators.spark import SparkSql

BAD = {7, 1234, 1999}
QUERY = ("SELECT k, sum(CASE WHEN id IN (7, 1234, 1999) THEN raise_error(concat('bad id ', "
         "id)) ELSE id END) AS total, count(*) AS n FROM input GROUP BY k")


def start(op: SparkSql, spark, on_error: str = "DEAD_LETTER") -> Emitted:
    emitted = Emitted()
    op.connect_outputs(emitted)
    op.setup(OperatorContext(name="sum", operator_id=1, container_id="c0",
                             attributes={"ON_ERROR": on_error}, spark=spark))
    return emitted


def rows(first: int, count: int) -> pa.RecordBatch:
    ids = list(range(first, first + count))
    return pa.record_batch({"id": ids, "k": [i % 3 for i in ids]})


@pytest.mark.slow
def test_a_failing_job_sets_its_bad_rows_aside_and_aggregates_the_rest(bridge):
    op = SparkSql(QUERY)
    emitted = start(op, bridge)
    run_window(op, 5, {"input": [rows(0, 1000), rows(1000, 1000)]})
    good = [i for i in range(2000) if i not in BAD]
    expected = {k: (sum(i for i in good if i % 3 == k), sum(1 for i in good if i % 3 == k))
                for k in range(3)}
    assert {r["k"]: (r["total"], r["n"]) for r in emitted.rows()} == expected
    dead = emitted.rows("errors")
    assert sorted(r["id"] for r in dead) == sorted(BAD)
    assert all(r["weir_error"].startswith("SparkRuntimeException: [USER_RAISED_EXCEPTION] "
                                          f"bad id {r['id']}") for r in dead), dead
    assert {(r["weir_operator"], r["weir_port"], r["weir_window_id"]) for r in dead} == {
        ("sum", "input", 5)}
    jobs = op.spark_costs()["jobs"]
    print(f"\n3 bad rows in 2,000: {jobs} jobs, {op.spark_costs()['job_ms']:.0f} ms in jobs")
    assert jobs <= 1 + 3 * 2 * 11 + 1  # the failed one, about 2 log2(n) per bad row, the rerun

    run_window(op, 6, {"input": [rows(3000, 10)]})  # a good window: one job, nothing aside
    assert op.spark_costs()["jobs"] == jobs + 1
    assert len(emitted.rows("errors")) == 3


def test_without_dead_letters_the_job_error_fails_the_window(bridge):
    op = SparkSql(QUERY)
    start(op, bridge, on_error="FAIL")
    with pytest.raises(Exception, match="USER_RAISED_EXCEPTION"):
        run_window(op, 5, {"input": [rows(0, 10)]})


def test_a_query_that_cannot_run_at_all_is_not_a_row_problem(bridge):
    op = SparkSql("SELECT no_such_column FROM input")
    emitted = start(op, bridge)
    with pytest.raises(Exception, match="UNRESOLVED_COLUMN"):
        run_window(op, 5, {"input": [rows(0, 10)]})
    assert emitted.rows("errors") == []


def test_a_window_failing_on_more_rows_than_max_rows_fails_after_few_dry_runs(monkeypatch):
    """Without Spark: the window's dry runs fail on every row; the breaker stops them."""
    monkeypatch.setattr(spark_dead_letters, "is_spark_record_error",
                        lambda exc: isinstance(exc, ValueError))
    runs: list[int] = []

    def rerun(tables: dict[str, pa.Table], emit: bool) -> None:
        runs.append(sum(t.num_rows for t in tables.values()))
        raise ValueError("bad row")

    op = SparkSql(QUERY)
    op.connect_outputs(Emitted())
    dead = DeadLetters(op, "sum", max_rows=3)
    with pytest.raises(TooManyDeadLetters, match=r"more than 3 of a batch's 1000 rows fail"):
        spark_dead_letters.set_aside_bad_rows({"input": [rows(0, 1000)]}, ValueError("bad"),
                                              rerun, dead, 5)
    assert len(runs) <= 2 * 4 + 10 and 0 not in runs  # not 2 x 1000 - 1 dry runs
