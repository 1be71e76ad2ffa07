"""Watermarks in the window loop: the minimum over inputs, never backwards, ended ports,
windows the loop makes up, a source's event times, its clear errors, and checkpoints."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from tests.container.test_window_loop import RecordingPublisher, SteppedClock, SumPerAppWindow
from weir.container.port_input import PortInput
from weir.container.runner_phase import RunnerState
from weir.container.stream_messages import Kind, Message
from weir.container.window_loop import OperatorRunner
from weir.operators.operator import InputOperator, Operator, OperatorContext
from weir.operators.ports import InputPort, OutputPort
from weir.operators.watermarks import (
    END_OF_TIME,
    IDLE,
    NO_WATERMARK,
    WATERMARKS_ATTRIBUTE,
    Watermarks,
)
from weir.runtime.operator_state import capture, new_partition, restore

pytestmark = pytest.mark.timeout(60)


def marked(windows: dict[int, int], *, end: bool = True) -> list[Message]:
    """A stream of empty windows whose END_WINDOWs carry these watermarks."""
    messages = []
    for w, mark in windows.items():
        messages += [Message(Kind.BEGIN_WINDOW, w),
                     Message.data(w, pa.record_batch({"x": [1]})),
                     Message(Kind.END_WINDOW, w, watermark=mark)]
    return messages + [Message(Kind.END_STREAM, max(windows))] if end else messages


def watermarks(publisher: RecordingPublisher) -> dict[int, int]:
    """Window id -> the watermark its END_WINDOW carried."""
    return {m.window_id: m.watermark for m in publisher.messages if m.kind == Kind.END_WINDOW}


class SeesWatermark(SumPerAppWindow):
    """Records the watermark it sees in each ``end_window``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def end_window(self) -> None:
        self.seen.append(self.watermark)
        super().end_window()


def run(operator: Operator, inputs: dict[str, list[Message]], *, app_windows: int = 1,
        checkpointer: object | None = None, **options: object
        ) -> tuple[OperatorRunner, RecordingPublisher]:
    stopped = threading.Event()
    ports = {name: PortInput(name, lambda _w, msgs=msgs: (iter(msgs), lambda: None), 8,
                             stopped, retry_s=0) for name, msgs in inputs.items()}
    publisher = RecordingPublisher()
    context = OperatorContext("op", 1, "c1", {"APPLICATION_WINDOW_COUNT": app_windows,
                                              "CHECKPOINT_WINDOW_COUNT": 1})
    runner = OperatorRunner(1, operator, context, {"output": publisher}, ports,
                            start_window_millis=time.time_ns() // 1_000_000,
                            on_change=lambda: None, stopped=stopped,
                            checkpointer=checkpointer, **options)
    runner.notify_committed(2**62)  # nothing waits for a commit at the end
    runner.start()
    assert runner.join(10), "operator thread did not finish within 10 s"
    return runner, publisher


def test_the_watermark_is_the_minimum_over_inputs_and_the_operator_sees_it_first():
    op = SeesWatermark()
    runner, out = run(op, {"a": marked({1: 100, 2: 300, 3: 500}),
                           "b": marked({1: 200, 2: 250, 3: 600})})
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert watermarks(out) == {1: 100, 2: 250, 3: 500}
    assert op.seen == [100, 250, 500], "end_window sees the window's watermark"
    assert [s.watermark_ms for s in runner.drain_stats()] == [100, 250, 500]


def test_the_watermark_never_goes_backwards():
    runner, out = run(SumPerAppWindow(), {"a": marked({1: 100, 2: 50, 3: NO_WATERMARK,
                                                       4: 150})})
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert watermarks(out) == {1: 100, 2: 100, 3: 100, 4: 150}


def test_an_ended_port_holds_nothing_back_and_the_end_is_end_of_time():
    """Port a ends after window 3 at 100; from then on b alone decides; the flush window
    after both ended (an application window left open) says END_OF_TIME."""
    runner, out = run(SumPerAppWindow(), {"a": marked({2: 100, 3: 100}),
                                          "b": marked({2: 300, 3: 400, 4: 500})},
                      app_windows=2)
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert watermarks(out) == {2: 100, 3: 100, 4: 500, 5: END_OF_TIME}


def test_windows_the_loop_makes_up_carry_the_last_known_input_watermarks():
    """Restored after window 4 knowing a at 150 and b at 300: a's window 5 says 200, a
    ends, b begins at window 8; the empty windows 6 and 7 in between go by b's 300."""
    op = SumPerAppWindow()
    marks = Watermarks(["a", "b"])
    marks.saw_input("a", 150)
    marks.saw_input("b", 300)
    marks.advance()
    op.__dict__[WATERMARKS_ATTRIBUTE] = marks
    runner, out = run(op, {"a": marked({5: 200}), "b": marked({8: 400})}, resume_window=4)
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert watermarks(out) == {5: 200, 6: 300, 7: 300, 8: 400}
    assert op.__dict__[WATERMARKS_ATTRIBUTE] is marks


class Timed(InputOperator):
    """Emits one batch per window of ``times`` (a list per window), then is exhausted."""

    output = OutputPort()

    def __init__(self, times: list[list[int]], column_type: pa.DataType | None = None) -> None:
        self.times = times
        self.column_type = column_type or pa.int64()
        self.windows = 0
        self.emitted = False
        self.seen: list[int] = []

    def begin_window(self, window_id: int) -> None:
        self.emitted = False

    def emit_tuples(self) -> bool:
        if self.emitted:  # one batch a window; the window after the last finds it exhausted
            return True
        if self.windows >= len(self.times):
            return False
        values = self.times[self.windows]
        self.output.emit(pa.record_batch({
            "t": pa.array(values, pa.int64()).cast(self.column_type),
            "x": pa.array(range(len(values)), pa.int64())}))
        self.emitted = True
        self.windows += 1
        return True

    def end_window(self) -> None:
        self.seen.append(self.watermark)


def run_source(source: InputOperator, **attributes: object
               ) -> tuple[OperatorRunner, RecordingPublisher]:
    publisher = RecordingPublisher()
    start_ms = 1_700_000_000_000
    context = OperatorContext("events", 1, "c1", {"STREAMING_WINDOW_SIZE_MILLIS": 100,
                                                  **attributes})
    runner = OperatorRunner(1, source, context, {"output": publisher}, {}, start_ms,
                            lambda: None, clock=SteppedClock(start_ms))
    runner.start()
    assert runner.join(10), "the source did not finish within 10 s"
    return runner, publisher


@pytest.mark.parametrize("column_type", [pa.int64(), pa.timestamp("us", tz="UTC")],
                         ids=["epoch-ms", "timestamp"])
def test_a_source_watermark_is_its_highest_event_time_minus_the_delay(column_type):
    times = [[1_000, 5_000, 3_000], [], [4_000], [9_000, 2_000]]
    if pa.types.is_timestamp(column_type):  # the same instants, in microseconds
        times = [[t * 1000 for t in window] for window in times]
    source = Timed(times, column_type)
    runner, out = run_source(source, EVENT_TIME_COLUMN="t", WATERMARK_DELAY_MILLIS=1_500)
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    marks = list(watermarks(out).values())
    # the window after the last batch finds the source exhausted: END_OF_TIME
    assert marks == [3_500, 3_500, 3_500, 7_500, END_OF_TIME]
    assert source.seen == marks
    assert [s.watermark_ms for s in runner.drain_stats()] == marks


def test_a_quiet_source_sends_idle_after_its_timeout_in_windows():
    """100 ms windows, IDLE_TIMEOUT_MILLIS=150: the second window in a row without rows
    makes it idle; its own watermark (in its stats) stays, rows make it count again."""
    times = [[1_000], [], [], [], [2_000]]
    runner, out = run_source(Timed(times), EVENT_TIME_COLUMN="t", IDLE_TIMEOUT_MILLIS=150)
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert list(watermarks(out).values()) == [1_000, 1_000, IDLE, IDLE, 2_000, END_OF_TIME]
    assert [s.watermark_ms for s in runner.drain_stats()] == [
        1_000, 1_000, 1_000, 1_000, 2_000, END_OF_TIME]


def test_a_source_without_event_time_column_says_end_of_time_only_at_its_end():
    runner, out = run_source(Timed([[1_000], [2_000]]))
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert list(watermarks(out).values()) == [NO_WATERMARK, NO_WATERMARK, END_OF_TIME]


def test_a_missing_event_time_column_fails_the_source_naming_it_and_the_fix():
    runner, out = run_source(Timed([[1_000]]), EVENT_TIME_COLUMN="ts")
    assert runner.state is RunnerState.FAILED and runner.fatal
    assert ("operator 'events' (EVENT_TIME_COLUMN): event-time column 'ts' is not in its "
            "input (t, x); name one of those columns") in runner.error
    assert not watermarks(out), "no window of it ended"


class Strings(InputOperator):
    output = OutputPort()

    def emit_tuples(self) -> bool:
        self.output.emit(pa.record_batch({"t": ["2024-01-01"]}))
        return False


def test_a_non_time_event_time_column_fails_the_source():
    runner, _ = run_source(Strings(), EVENT_TIME_COLUMN="t")
    assert runner.state is RunnerState.FAILED and runner.fatal
    assert "event-time column 't' is string, not a timestamp" in runner.error


def test_a_declared_output_schema_without_the_column_fails_at_setup():
    class Declared(Timed):
        output = OutputPort(pa.schema([("x", pa.int64())]))

    source = Declared([[1]])
    runner, out = run_source(source, EVENT_TIME_COLUMN="t")
    assert runner.state is RunnerState.FAILED and runner.fatal
    assert not runner.ready, "it failed at setup, before it was ready"
    assert "event-time column 't' is not in its input (x)" in runner.error
    assert out.messages == []


class MemoryCheckpointer:
    """Keeps each checkpoint's bytes, as the checkpoint store would."""

    def __init__(self) -> None:
        self.saved: dict[int, bytes] = {}

    def checkpoint(self, operator_id: int, window_id: int, operator: Operator) -> int:
        self.saved[window_id] = capture(operator)
        return len(self.saved[window_id])

    def committed(self, operator_id: int, window_id: int) -> None:
        pass


def test_a_restored_operator_goes_on_from_its_checkpointed_watermark():
    store = MemoryCheckpointer()
    runner, out = run(SumPerAppWindow(), {"a": marked({1: 100, 2: 300})}, checkpointer=store)
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert watermarks(out) == {1: 100, 2: 300}
    restored = restore(SumPerAppWindow(), store.saved[2])
    assert restored.watermark == 300
    # the replayed input after the checkpoint says less: the restored operator stays at 300
    runner, out = run(restored, {"a": marked({3: 200, 4: 400})}, resume_window=2)
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert watermarks(out) == {3: 300, 4: 400}
    # a fresh one (no checkpoint) would have said 200: the checkpoint is what kept it
    _, fresh = run(SumPerAppWindow(), {"a": marked({3: 200, 4: 400})}, resume_window=2)
    assert watermarks(fresh) == {3: 200, 4: 400}


def test_a_checkpoint_reports_its_size_as_the_state_size():
    store = MemoryCheckpointer()
    runner, _ = run(SumPerAppWindow(), {"a": marked({1: 100, 2: 300})}, checkpointer=store)
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    sizes = {s.checkpoint.window_id: s.checkpoint_stats.checkpoint_bytes
             for s in runner.drain_stats() if s.HasField("checkpoint")}
    assert sizes and sizes == {w: len(data) for w, data in store.saved.items()}


def test_a_restored_operator_counts_the_ports_connected_now():
    """A port it no longer has stops holding it back; a new one counts from none."""
    op = SumPerAppWindow()
    marks = Watermarks(["gone", "a"])
    marks.saw_input("a", 500)
    op.__dict__[WATERMARKS_ATTRIBUTE] = marks
    runner, out = run(op, {"a": marked({1: 600}), "b": marked({1: 700})})
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert watermarks(out) == {1: 600}
    assert set(marks.inputs) == {"a", "b"}


class Keyed(Operator):
    input = InputPort()
    KEYED_STATE = ("totals",)

    def __init__(self, totals: dict[str, int]) -> None:
        self.totals = totals


def test_a_new_partition_takes_the_lowest_watermark_of_the_old_ones_in_its_own_object():
    old = []
    for totals, mark in (({"a": 1}, 300), ({"b": 2}, 100)):
        op = Keyed(totals)
        op.__dict__[WATERMARKS_ATTRIBUTE] = marks = Watermarks(["input"])
        marks.saw_input("input", mark)
        marks.advance()
        old.append(op)
    new = new_partition(old, None)
    merged = new.__dict__[WATERMARKS_ATTRIBUTE]
    assert new.watermark == 100 and merged.inputs == {"input": 100}
    assert all(merged is not o.__dict__[WATERMARKS_ATTRIBUTE] for o in old)
    assert new.totals == {"a": 1, "b": 2}
    del old[1].__dict__[WATERMARKS_ATTRIBUTE]  # a checkpoint from before watermarks
    assert WATERMARKS_ATTRIBUTE not in new_partition(old, None).__dict__


def test_the_runtimes_watermarks_hide_nothing_of_the_operator():
    """KafkaSource has a ``_watermarks`` method: the runtime's attribute must not hide it."""

    class OwnWatermarks(Timed):
        def _watermarks(self) -> str:
            return "the operator's own"

    source = OwnWatermarks([[1_000]])
    runner, _ = run_source(source, EVENT_TIME_COLUMN="t")
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert source._watermarks() == "the operator's own"


def test_a_source_with_splits_sends_the_lowest_over_its_splits():
    """Rows of two Kafka-like partitions, one ahead of the other: the watermark follows
    the one behind; a source without WATERMARK_SPLITS would follow the one ahead."""

    class TwoSplits(InputOperator):
        WATERMARK_SPLITS = ("topic", "partition")
        output = OutputPort()

        def __init__(self) -> None:
            self.windows = [[(0, 5_000), (1, 1_000)], [(0, 9_000), (1, 2_000)]]
            self.emitted = False

        def begin_window(self, window_id: int) -> None:
            self.emitted = False

        def emit_tuples(self) -> bool:
            if self.emitted:
                return True
            if not self.windows:
                return False
            rows = self.windows.pop(0)
            self.output.emit(pa.record_batch({
                "topic": pa.array(["t"] * len(rows)),
                "partition": pa.array([p for p, _ in rows], pa.int32()),
                "t": pa.array([t for _, t in rows], pa.int64())}))
            self.emitted = True
            return True

    runner, out = run_source(TwoSplits(), EVENT_TIME_COLUMN="t")
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert list(watermarks(out).values()) == [1_000, 2_000, END_OF_TIME]


def test_a_stream_stopped_for_a_savepoint_keeps_its_watermark_and_says_so_downstream():
    """END_STREAM with a watermark (a stop for a savepoint) is not an end: the port's
    watermark stays where it was (open event-time windows stay open in the state), and
    the operator's own END_STREAM carries its watermark on."""
    from tests.container.test_window_loop import SumPerAppWindow, run
    from weir.container.stream_messages import Kind, Message

    messages = [Message(Kind.BEGIN_WINDOW, 1), Message(Kind.END_WINDOW, 1, watermark=5_000),
                Message(Kind.END_STREAM, 1, watermark=5_000)]
    runner, out = run(SumPerAppWindow(), {"a": messages})
    assert runner.suspended and runner.marks.current == 5_000
    assert [(m.kind, m.watermark) for m in out.messages if m.kind == Kind.END_STREAM] == [
        (Kind.END_STREAM, 5_000)]


@pytest.mark.parametrize("suspend", [True, False], ids=["savepoint", "shutdown"])
def test_a_source_stopped_for_a_savepoint_ends_its_stream_with_its_watermark(suspend):
    """Asked to end for a savepoint, a source's END_STREAM says its watermark (downstream
    keeps it, nothing closes); a plain shutdown's END_STREAM says none (the end)."""
    from weir.container.stream_messages import Kind

    publisher = RecordingPublisher()
    start_ms = 1_700_000_000_000
    context = OperatorContext("events", 1, "c1", {"STREAMING_WINDOW_SIZE_MILLIS": 100,
                                                  "EVENT_TIME_COLUMN": "t"})
    runner = OperatorRunner(1, Timed([[1_000, 5_000], [9_000]]), context,
                            {"output": publisher}, {}, start_ms, lambda: None,
                            clock=SteppedClock(start_ms))
    runner.request_end(suspend=suspend)  # before its first window: it ends after it
    runner.start()
    assert runner.join(10), "the source did not finish within 10 s"
    assert list(watermarks(publisher).values()) == [5_000]
    [end] = [m for m in publisher.messages if m.kind == Kind.END_STREAM]
    assert end.watermark == (5_000 if suspend else NO_WATERMARK)
