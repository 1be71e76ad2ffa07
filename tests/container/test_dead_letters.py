"""Dead letters in the window loop: rows ``process`` fails on leave on the errors port,
every other row is processed once, and the count is a metric kept with the state."""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from tests.container.test_window_loop import RecordingPublisher, stream
from weir.container.port_input import PortInput
from weir.container.runner_phase import RunnerState
from weir.container.stream_messages import Kind, Message
from weir.container.window_loop import OperatorRunner
from weir.operators.dead_letters import COUNT_ATTRIBUTE
from weir.operators.operator import Operator, OperatorContext
from weir.operators.ports import InputPort, OutputPort


class Inverse(Operator):
    """Emits 100 / x per row, in one go per batch: a zero fails the whole batch."""

    input = InputPort(pa.schema([("x", pa.int64())]))
    output = OutputPort()

    def __init__(self) -> None:
        self.rows_done = 0

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        values = [100 // x for x in batch.column("x").to_pylist()]
        self.rows_done += batch.num_rows
        self.output.emit(pa.record_batch({"x": values}))


def run(operator: Operator, messages: list[Message], on_error: str = "DEAD_LETTER"
        ) -> tuple[OperatorRunner, RecordingPublisher, RecordingPublisher]:
    stopped = threading.Event()
    port = PortInput("input", lambda _w: (iter(messages), lambda: None), 4, stopped,
                     retry_s=0)
    out, errors = RecordingPublisher(), RecordingPublisher()
    context = OperatorContext("inverse", 1, "c1", {"STREAMING_WINDOW_SIZE_MILLIS": 20,
                                                   "ON_ERROR": on_error})
    runner = OperatorRunner(1, operator, context, {"output": out, "errors": errors},
                            {"input": port}, start_window_millis=time.time_ns() // 1_000_000,
                            on_change=lambda: None, stopped=stopped)
    runner.start()
    assert runner.join(10), "operator thread did not finish within 10 s"
    return runner, out, errors


def dead_rows(publisher: RecordingPublisher) -> list[dict]:
    return [row for m in publisher.messages if m.kind == Kind.DATA
            for row in m.batch().to_pylist()]


def test_rows_process_fails_on_go_to_the_errors_port_and_the_rest_go_on():
    op = Inverse()
    runner, out, errors = run(op, stream({1: [[1, 0, 5, 4]], 2: [[2, 0]], 3: [[10]]}))
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert out.windows() == [(1, [100, 20, 25]), (2, [50]), (3, [10])]
    assert op.rows_done == 5  # the good rows, once each: failed tries emitted nothing
    assert dead_rows(errors) == [
        {"x": 0, "weir_error": "ZeroDivisionError: integer division or modulo by zero",
         "weir_operator": "inverse", "weir_port": "input", "weir_window_id": w}
        for w in (1, 2)]
    stats = runner.drain_stats()
    assert [s.metrics["dead_letters"] for s in stats] == [1, 2, 2]
    assert [s.output_ports[1].tuple_count for s in stats if s.output_ports[1].id == "errors"] \
        == [1, 1, 0]
    assert op.__dict__[COUNT_ATTRIBUTE] == 2  # state: a replay from a checkpoint goes on


def test_a_row_that_does_not_fit_the_port_is_a_dead_letter_too():
    runner, out, errors = run(Inverse(), [
        Message(Kind.BEGIN_WINDOW, 1),
        Message.data(1, pa.record_batch({"x": pa.array(["4", "many"])})),
        Message(Kind.END_WINDOW, 1), Message(Kind.END_STREAM, -1)])
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert out.windows() == [(1, [25])]
    (dead,) = dead_rows(errors)
    assert dead["x"] == "many" and dead["weir_error"].startswith("SchemaMismatch: ")


def test_without_dead_letters_the_first_bad_row_fails_the_operator():
    runner, out, errors = run(Inverse(), stream({1: [[1, 0]]}), on_error="FAIL")
    assert runner.state is RunnerState.FAILED
    assert runner.error.startswith("ZeroDivisionError")
    assert dead_rows(errors) == [] and out.windows() == [(1, [])]


def test_an_error_of_the_surroundings_is_not_set_aside():
    class Disconnected(Inverse):
        def process(self, port: str, batch: pa.RecordBatch) -> None:
            raise ConnectionResetError("the database went away")

    runner, _, errors = run(Disconnected(), stream({1: [[1, 2]]}))
    assert runner.state is RunnerState.FAILED
    assert "ConnectionResetError: the database went away" in runner.error
    assert dead_rows(errors) == []


def test_a_bug_on_every_row_fails_the_operator_at_once_instead_of_dead_lettering():
    class Buggy(Inverse):
        def process(self, port: str, batch: pa.RecordBatch) -> None:
            self.output.emit(self.lookup(batch))  # no such method: every row fails

    runner, out, errors = run(Buggy(), stream({1: [[1, 2, 3, 4]]}))
    assert runner.state is RunnerState.FAILED and runner.fatal  # a replay fails alike
    assert runner.error.startswith("TooManyDeadLetters: every row of a batch (4) fails with "
                                   "AttributeError: Buggy has no port or attribute 'lookup'")
    assert "test_dead_letters.py" in runner.error  # the place is the operator's line
    assert dead_rows(errors) == []
