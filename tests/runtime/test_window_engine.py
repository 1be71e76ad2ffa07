"""The window engine alone (``runtime.window_engine``): no threads, ports or clock, just
the rules each driver relies on, stepped by hand."""

from __future__ import annotations

import pyarrow as pa
import pytest

from weir.operators import InputOperator, InputPort, Operator, OperatorContext, OutputPort
from weir.operators.watermarks import NO_WATERMARK
from weir.operators.windows import make_window_id, window_counter
from weir.runtime.window_engine import WindowEngine

BASE = 1_700_000_000


def wid(counter: int) -> int:
    return make_window_id(BASE, counter)


class Recorder:
    """An output port: what the engine published, in order."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def begin_window(self, window_id: int) -> None:
        self.events.append(("begin", window_counter(window_id)))

    def data(self, window_id: int, batch: pa.RecordBatch) -> None:
        self.events.append(("data", window_counter(window_id), batch.num_rows))

    def end_window(self, window_id: int, watermark: int = NO_WATERMARK) -> None:
        self.events.append(("end", window_counter(window_id)))

    def end_stream(self, watermark: int = NO_WATERMARK) -> None:
        self.events.append(("end_stream", watermark))


class Hooks(Operator):
    """Records its hooks; passes its input on."""

    input = InputPort()
    output = OutputPort()

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def begin_window(self, window_id: int) -> None:
        self.calls.append(("begin_window", window_counter(window_id)))

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        self.calls.append(("process", batch.num_rows))
        self.output.emit(batch)

    def end_window(self) -> None:
        self.calls.append(("end_window",))

    def checkpointed(self, window_id: int) -> None:
        self.calls.append(("checkpointed", window_counter(window_id)))

    def committed(self, window_id: int) -> None:
        self.calls.append(("committed", window_counter(window_id)))


class Replaying(InputOperator):
    output = OutputPort()

    def __init__(self, logged: int | None) -> None:
        self.logged = logged

    def emit_tuples(self) -> bool:
        return False

    def first_window(self) -> int | None:
        return self.logged


def engine(operator: Operator, *, resume: int = -1, skip: bool = False,
           **attributes: object) -> tuple[WindowEngine, Recorder]:
    context = OperatorContext(name="op", operator_id=1, container_id="test",
                              attributes={"CHECKPOINT_WINDOW_COUNT": 4, **attributes})
    out = Recorder()
    inputs = [] if isinstance(operator, InputOperator) else ["input"]
    return WindowEngine(operator, context, inputs, {"output": out}, resume_window=resume,
                        skip_missed_windows=skip), out


def test_hooks_run_once_per_application_window_aligned_to_the_window_counter():
    op = Hooks()
    eng, out = engine(op, APPLICATION_WINDOW_COUNT=2)
    ends = []
    for counter in (3, 4, 5):  # starts at an odd counter: its first application window is 1
        eng.begin(wid(counter))
        eng.process("input", pa.record_batch({"x": [counter]}))
        ends.append(eng.end(wid(counter)).checkpoint)
    assert op.calls == [("begin_window", 3), ("process", 1), ("end_window",),
                        ("begin_window", 4), ("process", 1), ("process", 1), ("end_window",)]
    assert ends == [True, False, False]  # due at counter 3 ((3 + 1) % 4 == 0)
    assert out.events[:3] == [("begin", 3), ("data", 3, 1), ("end", 3)]


def test_a_due_checkpoint_waits_for_the_application_windows_end():
    eng, _ = engine(Hooks(), APPLICATION_WINDOW_COUNT=2)
    due = []
    for counter in range(2, 10):
        eng.begin(wid(counter))
        due.append((counter, eng.end(wid(counter)).checkpoint))
    assert [c for c, d in due if d] == [3, 7]


def test_alignment_runs_the_lowest_window_fills_the_gap_and_refuses_going_back():
    eng, _ = engine(Hooks())
    empties, window = eng.align({"input": wid(5)})
    assert (list(empties), window) == ([], wid(5))  # nothing ran yet: no gap to fill
    eng.begin(wid(5))
    eng.end(wid(5))
    empties, window = eng.align({"input": wid(8), "other": wid(9)})
    assert [window_counter(w) for w in empties] == [6, 7] and window == wid(8)
    with pytest.raises(RuntimeError, match="windows must increase"):
        eng.align({"input": wid(5)})
    skipping, _ = engine(Hooks(), resume=wid(5), skip=True)
    assert list(skipping.align({"input": wid(9)})[0]) == []


def test_the_stream_ends_in_one_more_window_only_when_something_is_open():
    eng, out = engine(Hooks(), APPLICATION_WINDOW_COUNT=3)
    eng.begin(wid(0))
    eng.end(wid(0))
    eng.input_stream_ended("input", wid(0), NO_WATERMARK)
    assert eng.flush_window() == wid(1)  # inside an application window: flushed in 1
    done, _ = engine(Hooks())
    done.begin(wid(0))
    done.end(wid(0))
    done.input_stream_ended("input", wid(0), NO_WATERMARK)
    assert done.flush_window() is None
    done.input_stream_ended("input", wid(4), NO_WATERMARK)  # the input went further
    assert done.flush_window() == wid(4)


def test_a_stream_ended_for_a_savepoint_keeps_its_watermark():
    eng, out = engine(Hooks())
    eng.input_stream_ended("input", wid(0), 1_234)
    assert eng.suspended
    eng.end_stream()
    assert out.events[-1][0] == "end_stream" and out.events[-1][1] != NO_WATERMARK


def test_checkpointed_then_committed_reach_the_operator_once_each():
    op = Hooks()
    eng, _ = engine(op)
    eng.begin(wid(3))
    assert eng.end(wid(3), last=True).checkpoint
    assert eng.final_checkpoint_due  # the driver has not saved it yet
    eng.checkpointed(wid(3))
    assert not eng.final_checkpoint_due
    assert eng.commit(wid(3)) and not eng.commit(wid(3)) and not eng.commit(wid(2))
    assert op.calls[-2:] == [("checkpointed", 3), ("committed", 3)]


@pytest.mark.parametrize(("resume", "skip", "logged", "now", "first"), [
    (-1, False, None, 7, 7),  # fresh: the current window
    (-1, False, 2, 7, 2),  # fresh, but an earlier instance logged windows: replay them
    (4, False, 2, 9, 5),  # restored: the window after the checkpoint
    (4, True, None, 9, 9),  # restored, AT_MOST_ONCE: the current one
])
def test_a_sources_first_window(resume, skip, logged, now, first):
    eng, _ = engine(Replaying(wid(logged) if logged is not None else None),
                    resume=wid(resume) if resume >= 0 else -1, skip=skip)
    assert eng.first_window(BASE, now) == wid(first)


def test_an_emit_outside_a_window_or_on_no_port_is_refused_and_unconnected_ports_are_quiet():
    op = Hooks()
    eng, out = engine(op)
    with pytest.raises(RuntimeError, match="outside a window"):
        op.output.emit(pa.record_batch({"x": [1]}))
    eng.begin(wid(0))
    with pytest.raises(KeyError, match="no output port 'nope'"):
        eng._emit("nope", pa.record_batch({"x": [1]}))
    eng.process("input", pa.record_batch({"x": [1, 2]}))
    assert eng.rows_in == {"input": 2} and eng.rows_out == {"output": 2} and eng.emitted == 2
