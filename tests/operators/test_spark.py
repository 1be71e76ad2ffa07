"""SparkOperator and SparkSql driven through their hooks, against a real local Spark."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import pyarrow as pa
import pytest

from weir.operators.operator import Operator, OperatorContext
from weir.operators.ports import InputPort, OutputPort
from weir.operators.spark import SparkOperator, SparkOperatorError, SparkSql
from weir.operators.windows import make_window_id
from weir.runtime.spark.bridge import SparkSessionBridge

W1 = make_window_id(1_700_000_000, 1)


class Emitted:
    """Stands in for the runtime's emit function: keeps batches per output port."""

    def __init__(self) -> None:
        self.batches: dict[str, list[pa.RecordBatch]] = defaultdict(list)

    def __call__(self, port: str, batch: pa.RecordBatch) -> None:
        self.batches[port].append(batch)

    def rows(self, port: str = "output") -> list[dict[str, Any]]:
        return [r for b in self.batches[port] for r in b.to_pylist()]


def start(op: Operator, spark: Any, name: str = "op") -> Emitted:
    emitted = Emitted()
    op.connect_outputs(emitted)
    context = OperatorContext(name=name, operator_id=1, container_id="c0", attributes={},
                              spark=spark)
    op.setup(context)
    op.activate(context)
    return emitted


def run_window(op: Operator, window_id: int, inputs: dict[str, list[pa.RecordBatch]]) -> None:
    op.begin_window(window_id)
    for port, batches in inputs.items():
        for batch in batches:
            op.process(port, batch)
    op.end_window()


class NoSpark:
    """A bridge that fails the test if anything asks it for Spark beyond warming up."""

    def __init__(self) -> None:
        self.warmed = 0

    def warm_up(self) -> None:
        self.warmed += 1

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"Spark was used: {name}")


class Recording(SparkOperator):
    def __init__(self) -> None:
        self.calls: list[int] = []

    def transform(self, inputs, window_id):
        self.calls.append(window_id)
        return inputs["input"]


def test_empty_window_runs_no_job() -> None:
    op, spark = Recording(), NoSpark()
    emitted = start(op, spark)
    assert spark.warmed == 1  # activate warms Spark up, so no window pays the cold start
    run_window(op, W1, {})
    run_window(op, W1 + 1, {"input": [pa.record_batch({"x": pa.array([], pa.int64())})]})
    assert op.calls == [] and not emitted.batches


def test_missing_bridge_names_the_operator() -> None:
    with pytest.raises(SparkOperatorError, match=r"'counter'.*context.spark is None"):
        start(Recording(), None, name="counter")


def test_sql_over_the_input_port(bridge: SparkSessionBridge) -> None:
    schema = pa.schema([("word", pa.string()), ("n", pa.int64()), ("window_id", pa.int64())])
    op = SparkSql("SELECT word, count(*) AS n, :window_id AS window_id FROM input "
                  "GROUP BY word ORDER BY word", output_schema=schema)
    emitted = start(op, bridge)
    batches = [pa.record_batch({"word": ["b", "a", "b"]}), pa.record_batch({"word": ["b"]})]
    run_window(op, W1, {"input": batches})
    assert emitted.rows() == [{"word": "a", "n": 1, "window_id": W1},
                              {"word": "b", "n": 3, "window_id": W1}]
    assert emitted.batches["output"][0].schema == schema
    # the view lives in the operator's own session, not in the bridge's
    assert not bridge.session.catalog.tableExists("input")
    assert os.listdir(bridge.scratch_dir) == []


class Split(SparkOperator):
    """Two declared inputs and two outputs: the default ports go away."""

    left = InputPort()
    right = InputPort(pa.schema([("k", pa.int64()), ("r", pa.string())]))
    joined = OutputPort()
    unmatched = OutputPort()

    def transform(self, inputs, window_id):
        left, right = inputs["left"], inputs["right"]
        return {"joined": left.join(right, "k").orderBy("k"),
                "unmatched": left.join(right, "k", "left_anti").orderBy("k")}


def test_several_ports_and_a_result_per_output(bridge: SparkSessionBridge) -> None:
    assert sorted(Split.input_ports()) == ["left", "right"]
    assert sorted(Split.output_ports()) == ["joined", "unmatched"]
    op = Split()
    emitted = start(op, bridge)
    # only the left side has data: right is empty, with its declared schema
    run_window(op, W1, {"left": [pa.record_batch({"k": [1, 2], "l": ["x", "y"]})]})
    assert emitted.rows("joined") == []
    assert emitted.rows("unmatched") == [{"k": 1, "l": "x"}, {"k": 2, "l": "y"}]
    run_window(op, W1 + 1, {"left": [pa.record_batch({"k": [1, 2], "l": ["x", "y"]})],
                            "right": [pa.record_batch({"k": [2], "r": ["z"]})]})
    assert emitted.rows("joined") == [{"k": 2, "l": "y", "r": "z"}]
    assert os.listdir(bridge.scratch_dir) == []


class Wrong(SparkOperator):
    def transform(self, inputs, window_id):
        return [inputs["input"]]


def test_transform_result_is_checked(bridge: SparkSessionBridge) -> None:
    op = Wrong()
    start(op, bridge, name="wrong")
    with pytest.raises(SparkOperatorError, match=r"'wrong'.*returned a list"):
        run_window(op, W1, {"input": [pa.record_batch({"x": [1]})]})
    assert os.listdir(bridge.scratch_dir) == []  # files go even when the window fails


def test_window_jobs_report_their_costs_by_phase(bridge: SparkSessionBridge) -> None:
    from weir.operators.metrics import collect_metrics

    op = Recording()
    start(op, bridge)
    run_window(op, W1, {"input": [pa.record_batch({"x": [1, 2]}),
                                  pa.record_batch({"x": [3]})]})
    run_window(op, W1 + 1, {})  # no rows: no job, nothing counted
    figures = collect_metrics(op)
    assert figures["spark[jobs]"] == 1 and figures["spark[rows_in]"] == 3
    assert {f"spark[{phase}_ms]" for phase in ("write", "handoff", "job", "emit")} <= set(figures)
    assert figures["spark[job_ms]"] > 0  # the job ran in to_arrow, inside the "job" phase
