"""User metrics: declared with METRICS or @metric, read after every window into its stats."""

from __future__ import annotations

import logging

import pyarrow as pa

from tests.container.test_window_loop import run, stream
from weir.operators import Operator, metric
from weir.operators.metrics import collect_metrics, metric_names
from weir.operators.ports import InputPort, OutputPort


class Counting(Operator):
    input = InputPort()
    output = OutputPort()
    METRICS = ("rows",)

    def __init__(self) -> None:
        self.rows = 0

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows

    @metric("rows_doubled")
    def _doubled(self) -> int:
        return self.rows * 2


class Broken(Counting):
    METRICS = ("name", "missing")

    def __init__(self) -> None:
        super().__init__()
        self.name = "not a number"

    @metric
    def fails(self) -> float:
        raise RuntimeError("boom")


def test_each_window_carries_the_metrics_as_they_were_at_its_end():
    runner, _ = run(Counting(), {"input": stream({1: [[1, 2, 3]], 2: [[4]]})})
    stats = runner.drain_stats()
    assert [dict(s.metrics) for s in stats] == [{"rows": 3.0, "rows_doubled": 6.0},
                                                {"rows": 4.0, "rows_doubled": 8.0}]


def test_bad_metrics_are_left_out_and_logged_once(caplog):
    operator = Broken()
    with caplog.at_level(logging.WARNING, logger="weir.operators.metrics"):
        assert collect_metrics(operator) == {"rows": 0.0, "rows_doubled": 0.0}
        assert collect_metrics(operator) == {"rows": 0.0, "rows_doubled": 0.0}
    assert len(caplog.records) == 3  # name, missing, fails: once each
    assert metric_names(operator) == ["rows", "name", "missing", "rows_doubled", "fails"]


def test_an_operator_without_metrics_costs_nothing():
    class Plain(Operator):
        pass

    assert collect_metrics(Plain()) == {} and metric_names(Plain()) == []
