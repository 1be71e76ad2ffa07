"""The window loop with in-memory inputs and publishers: alignment, app windows, END_STREAM."""

from __future__ import annotations

import logging
import threading
import time

import pyarrow as pa
import pytest

from weir.container.port_input import PortInput
from weir.container.runner_phase import RunnerState
from weir.container.stream_messages import Kind, Message
from weir.container.window_loop import OperatorRunner
from weir.operators.operator import InputOperator, Operator, OperatorContext
from weir.operators.ports import InputPort, OutputPort
from weir.operators.watermarks import NO_WATERMARK


class RecordingPublisher:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.bytes_published = 0

    def begin_window(self, window_id: int) -> None:
        self.messages.append(Message(Kind.BEGIN_WINDOW, window_id))

    def data(self, window_id: int, batch: pa.RecordBatch) -> None:
        message = Message.data(window_id, batch)
        self.bytes_published += message.nbytes
        self.messages.append(message)

    def end_window(self, window_id: int, watermark: int = NO_WATERMARK) -> None:
        self.messages.append(Message(Kind.END_WINDOW, window_id, watermark=watermark))

    def end_stream(self, watermark: int = NO_WATERMARK) -> None:
        self.messages.append(Message(Kind.END_STREAM, -1, watermark=watermark))

    def windows(self) -> list[tuple[int, list[int]]]:
        """(window id, values of column x emitted in it) per window."""
        out: list[tuple[int, list[int]]] = []
        for m in self.messages:
            if m.kind == Kind.BEGIN_WINDOW:
                out.append((m.window_id, []))
            elif m.kind == Kind.DATA:
                out[-1][1].extend(m.batch().column("x").to_pylist())
        return out


def stream(windows: dict[int, list[list[int]]]) -> list[Message]:
    messages = []
    for w, batches in windows.items():
        messages.append(Message(Kind.BEGIN_WINDOW, w))
        messages += [Message.data(w, pa.record_batch({"x": b})) for b in batches]
        messages.append(Message(Kind.END_WINDOW, w))
    return [*messages, Message(Kind.END_STREAM, -1)]


class SumPerAppWindow(Operator):
    """Emits the sum of x over each application window, and the window ids it began."""

    a = InputPort()
    b = InputPort(optional=True)
    output = OutputPort()

    def __init__(self) -> None:
        self.began: list[int] = []
        self.total = 0

    def begin_window(self, window_id: int) -> None:
        self.began.append(window_id)
        self.total = 0

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        self.total += sum(batch.column("x").to_pylist())

    def end_window(self) -> None:
        self.output.emit(pa.record_batch({"x": [self.total]}))


def run(operator: Operator, inputs: dict[str, list[Message]], app_windows: int = 1,
        **runner_options) -> tuple[OperatorRunner, RecordingPublisher]:
    stopped = threading.Event()
    ports = {
        name: PortInput(name, lambda _w, msgs=msgs: (iter(msgs), lambda: None), 4,
                        stopped, retry_s=0)
        for name, msgs in inputs.items()
    }
    publisher = RecordingPublisher()
    context = OperatorContext("op", 1, "c1", {"APPLICATION_WINDOW_COUNT": app_windows,
                                              "STREAMING_WINDOW_SIZE_MILLIS": 20})
    runner = OperatorRunner(1, operator, context, {"output": publisher}, ports,
                            start_window_millis=time.time_ns() // 1_000_000,
                            on_change=lambda: None, stopped=stopped, **runner_options)
    runner.start()
    assert runner.join(10), "operator thread did not finish within 10 s"
    return runner, publisher


def test_two_inputs_are_aligned_by_window():
    op = SumPerAppWindow()
    runner, out = run(op, {"a": stream({1: [[1, 2]], 2: [[3]], 3: [], 4: [[5]]}),
                           "b": stream({2: [[10]], 3: [[20]], 4: [[30]]})})
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert out.windows() == [(1, [3]), (2, [13]), (3, [20]), (4, [35])]
    assert out.messages[-1].kind == Kind.END_STREAM


def test_a_window_missing_from_a_stream_fails_the_operator_naming_the_gap():
    op = SumPerAppWindow()
    runner, out = run(op, {"a": stream({1: [[1]], 2: [[2]], 5: [[3]]})})
    assert runner.state is RunnerState.FAILED
    assert ("WindowGap: input port 'a': window 0:5 arrived after window 0:2; the windows in "
            "between are missing") in runner.error
    assert out.windows() == [(1, [1]), (2, [2])]  # nothing of window 5 was processed


def test_windows_between_two_inputs_are_processed_empty_never_skipped():
    """One input ends before the other begins: the windows in between are empty windows."""
    op = SumPerAppWindow()
    runner, out = run(op, {"a": stream({1: [[1]], 2: [[2]]}), "b": stream({5: [[7]]})})
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert out.windows() == [(1, [1]), (2, [2]), (3, [0]), (4, [0]), (5, [7])]


def test_an_operator_that_skipped_to_its_inputs_end_ends_there_too():
    """AT_MOST_ONCE, restarted after window 3, finds its upstream ended at window 7: it
    ends at 7 as well (an empty window), not at 3, so the upstream's last window can be
    committed."""
    op = SumPerAppWindow()
    ended = [Message(Kind.END_STREAM, 7)]
    runner, out = run(op, {"a": ended}, resume_window=3, skip_missed_windows=True)
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert out.windows() == [(7, [0])]
    assert [s.window_id for s in runner.drain_stats()] == [7]


def test_application_window_spans_streaming_windows_and_flushes_at_end():
    op = SumPerAppWindow()
    runner, out = run(op, {"a": stream({2: [[1]], 3: [[2]], 4: [[4]]})}, app_windows=2)
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert op.began == [2, 4]
    # sums land in the last streaming window of each application window; the partial
    # application window (window 4) is flushed in one extra window at END_STREAM.
    assert out.windows() == [(2, []), (3, [3]), (4, []), (5, [4])]


def test_application_windows_end_where_the_window_counter_does_whatever_the_first():
    """A fresh operator whose first window is 3 (of 2-window application windows) ends
    its first application window with window 3: application windows, and so checkpoints,
    fall on the same windows for every operator, whatever window each started at."""
    op = SumPerAppWindow()
    runner, out = run(op, {"a": stream({3: [[1]], 4: [[2]], 5: [[4]]})}, app_windows=2)
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert op.began == [3, 4]
    assert out.windows() == [(3, [1]), (4, []), (5, [6])]


def test_a_restored_operator_keeps_the_phase_of_its_checkpoint():
    op = SumPerAppWindow()
    runner, out = run(op, {"a": stream({5: [[1]], 6: [[2]], 7: [[4]]})}, app_windows=2,
                      resume_window=4)
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert op.began == [5, 7]
    assert out.windows() == [(5, []), (6, [3]), (7, []), (8, [4])]


def test_window_stats_count_rows_per_port():
    runner, _ = run(SumPerAppWindow(), {"a": stream({1: [[1, 2, 3]], 2: [[4]]})})
    stats = runner.drain_stats()
    assert [s.window_id for s in stats] == [1, 2]
    assert [s.input_ports[0].tuple_count for s in stats] == [3, 1]
    assert [s.output_ports[0].tuple_count for s in stats] == [1, 1]
    assert runner.drain_stats() == []


def test_out_of_order_window_fails_the_operator():
    messages = stream({2: [[1]]})[:-1] + stream({1: [[1]]})
    runner, _ = run(SumPerAppWindow(), {"a": messages})
    assert runner.state is RunnerState.FAILED
    assert "window 0:1 arrived after window 0:2" in runner.error


def test_operator_exception_fails_with_its_message():
    class Broken(SumPerAppWindow):
        def process(self, port, batch):
            raise ValueError("bad tuple")

    runner, _ = run(Broken(), {"a": stream({1: [[1]]})})
    assert runner.state is RunnerState.FAILED
    assert runner.error.startswith("ValueError: bad tuple (at test_window_loop.py:")
    assert runner.error.endswith("in process)")


class Counter(InputOperator):
    output = OutputPort()

    def __init__(self, n: int) -> None:
        self.n = n
        self.i = 0

    def emit_tuples(self) -> bool:
        if self.i >= self.n:
            return False
        self.output.emit(pa.record_batch({"x": [self.i]}))
        self.i += 1
        return True


def test_input_operator_emits_until_exhausted_then_ends_stream():
    runner, out = run(Counter(5), {})
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    values = [x for _, xs in out.windows() for x in xs]
    assert values == [0, 1, 2, 3, 4]
    ids = [w for w, _ in out.windows()]
    assert ids == sorted(set(ids)), "window ids must increase"
    assert out.messages[-1].kind == Kind.END_STREAM


def test_stop_ends_a_blocked_operator_without_end_stream():
    stopped = threading.Event()
    never = threading.Event()

    def subscribe(_from_window):
        def messages():
            yield Message(Kind.BEGIN_WINDOW, 1)
            never.wait(5)
        return messages(), never.set

    publisher = RecordingPublisher()
    runner = OperatorRunner(1, SumPerAppWindow(), OperatorContext("op", 1, "c1", {}),
                            {"output": publisher}, {"a": PortInput("a", subscribe, 4, stopped)},
                            0, lambda: None, stopped=stopped)
    runner.start()
    runner.stop(timeout_s=3)
    assert runner.join(0.1)
    assert all(m.kind != Kind.END_STREAM for m in publisher.messages)


@pytest.mark.parametrize("kind", [Kind.DATA, Kind.END_WINDOW])
def test_stream_not_starting_with_begin_window_fails(kind):
    bad = [Message.data(1, pa.record_batch({"x": [1]})) if kind == Kind.DATA
           else Message(Kind.END_WINDOW, 1), Message(Kind.END_STREAM, -1)]
    runner, _ = run(SumPerAppWindow(), {"a": bad})
    assert runner.state is RunnerState.FAILED
    assert "expected BEGIN_WINDOW" in runner.error


def test_input_operator_waits_for_activation_after_setup():
    from weir.container.runner_phase import RunnerPhase

    publisher = RecordingPublisher()
    changed = threading.Event()
    runner = OperatorRunner(1, Counter(2), OperatorContext("op", 1, "c1", {}),
                            {"output": publisher}, {}, time.time_ns() // 1_000_000,
                            on_change=changed.set, wait_for_activation=True)
    runner.start()
    try:
        assert changed.wait(5), "setup done must be reported at once"
        deadline = time.monotonic() + 5
        while runner.phase is not RunnerPhase.WAITING and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runner.ready and runner.phase is RunnerPhase.WAITING
        assert publisher.messages == [], "an input operator must not start before activation"
        assert runner.heartbeat(500).ready
        runner.activate()
        assert runner.join(5)
        assert [x for _, xs in publisher.windows() for x in xs] == [0, 1]
    finally:
        runner.stop(timeout_s=2)


class SlowToActivate(SumPerAppWindow):
    """Sums, after an ``activate`` that waits for the test (a JVM starting)."""

    def __init__(self) -> None:
        super().__init__()
        self.activating = threading.Event()
        self.go = threading.Event()
        self.began_before_activated = False

    def activate(self, context: OperatorContext) -> None:
        self.activating.set()
        assert self.go.wait(10), "the test never let activate() return"

    def begin_window(self, window_id: int) -> None:
        self.began_before_activated |= not self.go.is_set()
        super().begin_window(window_id)


def test_ready_is_reported_before_activate_runs_and_no_window_begins_until_it_returns():
    from weir.container.runner_phase import RunnerPhase

    op = SlowToActivate()
    stopped = threading.Event()
    port = PortInput("a", lambda _w: (iter(stream({1: [[1]], 2: [[2]]})), lambda: None), 4,
                     stopped, retry_s=0)
    publisher = RecordingPublisher()
    runner = OperatorRunner(1, op, OperatorContext("op", 1, "c1", {}), {"output": publisher},
                            {"a": port}, time.time_ns() // 1_000_000, on_change=lambda: None,
                            stopped=stopped)
    runner.start()
    try:
        assert op.activating.wait(5)
        beat = runner.heartbeat(500)
        # ready (setup returned: the master may start the sources), but still activating
        assert (beat.ready, beat.activating) == (True, True)
        assert runner.phase is RunnerPhase.ACTIVATING and publisher.messages == []
        op.go.set()
        assert runner.join(10)
        assert not runner.heartbeat(500).activating
        assert publisher.windows() == [(1, [1]), (2, [2])] and not op.began_before_activated
    finally:
        op.go.set()
        runner.stop(timeout_s=2)


class SteppedClock:
    """A clock that moves only when the window loop idles: each sleep moves it on."""

    def __init__(self, start_ms: int) -> None:
        self.ms = start_ms
        self.start_s = 1000.0

    def now_ms(self) -> int:
        return self.ms

    def monotonic(self) -> float:
        return self.start_s + (self.ms / 1000)

    def sleep(self, seconds: float) -> None:
        self.ms += max(1, round(seconds * 1000))


class Quiet(InputOperator):
    """Emits nothing for ``windows`` windows (it idles), then ends its stream."""

    output = OutputPort()

    def __init__(self, windows: int) -> None:
        self.windows = windows
        self.begun = 0

    def begin_window(self, window_id: int) -> None:
        self.begun += 1

    def emit_tuples(self) -> bool:
        return self.begun < self.windows


def test_windows_close_by_the_injected_clock_not_by_sleeping():
    """Issue 18: a test steps time; 50 windows of 500 ms take no half minute."""
    from weir.operators.windows import window_counter

    publisher = RecordingPublisher()
    start_ms = 1_700_000_000_000
    clock = SteppedClock(start_ms)
    runner = OperatorRunner(1, Quiet(50), OperatorContext(
        "op", 1, "c1", {"STREAMING_WINDOW_SIZE_MILLIS": 500}), {"output": publisher}, {},
        start_ms, lambda: None, clock=clock)
    runner.start()
    assert runner.join(10), "the stepped clock closed the windows"
    ids = [w for w, _ in publisher.windows()]
    assert [window_counter(w) for w in ids] == list(range(50))
    assert clock.ms - start_ms >= 49 * 500  # every window lasted its 500 ms, of fake time


def test_input_resubscribes_after_a_broken_connection_without_duplicates():
    full = stream({1: [[1], [2]], 2: [[3], [4]]})
    calls: list[int] = []

    def subscribe(from_window):
        calls.append(from_window)
        if len(calls) == 1:
            def broken():
                yield from full[:6]  # window 1 whole, then BEGIN(2) and its first batch
                raise ConnectionError("buffer server went away")
            return broken(), lambda: None
        return iter([m for m in full if m.window_id > from_window or m.window_id < 0]), \
            lambda: None

    stopped = threading.Event()
    publisher = RecordingPublisher()
    runner = OperatorRunner(1, SumPerAppWindow(), OperatorContext("op", 1, "c1", {}),
                            {"output": publisher},
                            {"a": PortInput("a", subscribe, 4, stopped, retry_s=5)},
                            time.time_ns() // 1_000_000, lambda: None, stopped=stopped)
    runner.start()
    assert runner.join(10)
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert calls == [-1, 1], "the second subscription starts after the last whole window"
    assert out_sums(publisher) == [3, 7]


def out_sums(publisher: RecordingPublisher) -> list[int]:
    return [x for _, xs in publisher.windows() for x in xs]


def test_emitting_on_an_unconnected_output_is_dropped_and_an_unknown_port_fails(caplog):
    class TwoOutputs(Operator):
        input = InputPort()
        main = OutputPort()
        debug = OutputPort()

        def process(self, port, batch):
            self.debug.emit(batch)  # nobody subscribed to debug
            self.main.emit(batch)

    with caplog.at_level(logging.WARNING, logger="weir.container.window_loop"):
        runner, out = run_with_output("main", TwoOutputs(), stream({1: [[1, 2]], 2: [[3]]}))
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert out_sums(out) == [1, 2, 3]
    said = [r.getMessage() for r in caplog.records if "not connected" in r.getMessage()]
    assert said == ["operator=op emits rows on its output port 'debug', which is not "
                    "connected: they go nowhere; connect it to keep them"]  # once, not per row

    class Typo(TwoOutputs):
        def process(self, port, batch):
            self.emitter("mian", batch)

    runner, _ = run_with_output("main", Typo(), stream({1: [[1]]}))
    assert runner.state is RunnerState.FAILED
    assert "has no output port 'mian'" in runner.error


def run_with_output(port: str, operator: Operator, messages: list[Message]
                    ) -> tuple[OperatorRunner, RecordingPublisher]:
    stopped = threading.Event()
    publisher = RecordingPublisher()
    inputs = {"input": PortInput("input", lambda _w: (iter(messages), lambda: None), 4,
                                 stopped, retry_s=0)}
    runner = OperatorRunner(1, operator, OperatorContext("op", 1, "c1", {}), {port: publisher},
                            inputs, time.time_ns() // 1_000_000, lambda: None, stopped=stopped)
    runner.start()
    assert runner.join(10)
    return runner, publisher


def test_a_runner_moves_through_its_phases_and_a_stopped_one_ends_stopped():
    """The phases, not flags: a runner that ends its stream finishes; one that is stopped
    ends STOPPED (it used to stay ACTIVE for good)."""
    from weir.container.runner_phase import RunnerPhase

    class Relay(Operator):
        input = InputPort()
        output = OutputPort()

        def process(self, port, batch):
            self.output.emit(batch)

    runner, _ = run_with_output("output", Relay(), stream({1: [[1, 2]]}))
    assert runner.phase is RunnerPhase.FINISHED and runner.state is RunnerState.SHUTDOWN
    assert runner.ready
    stopped = threading.Event()
    release = threading.Event()

    def waiting(_window):  # an input that has nothing yet
        release.wait(10)
        return iter(()), release.set

    inputs = {"input": PortInput("input", waiting, 4, stopped, retry_s=0)}
    idle = OperatorRunner(2, Relay(), OperatorContext("op", 2, "c1", {}), {}, inputs,
                          time.time_ns() // 1_000_000, lambda: None, stopped=stopped)
    idle.start()
    idle.stop(timeout_s=10)
    assert not idle.alive and idle.phase is RunnerPhase.STOPPED
    with pytest.raises(RuntimeError, match="no transition RUNNING -> SETTING_UP"):
        RunnerPhase.RUNNING.to(RunnerPhase.SETTING_UP, "op")
