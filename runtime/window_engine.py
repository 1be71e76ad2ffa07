"""The rules of running one operator window by window, once, for both drivers.

A driver (the container's ``container.window_loop.OperatorRunner``: threads, ports, lease,
stats; or the local test runner ``runtime.local``: one thread, a fast clock) reads input,
keeps time and stores checkpoints; the engine decides everything else, and does no I/O of
its own: the hook order (``setup``, ``activate``, ``begin_window`` / ``end_window`` per application
window, ``checkpointed``, ``committed``, ``teardown``), where application windows begin
and end, input alignment (which window runs next, which are empty), watermarks, when a
checkpoint is due, the first window of a source (fresh, restored or replaying), dead
letters and the cast to a port's schema, and the end of the stream (flushed, or suspended
for a savepoint).

A driver's loop, for an operator with inputs::

    engine.setup(); (report ready: sources may start); engine.activate()
    while ports are open:
        heads = {port: its next BEGIN_WINDOW}            # END_STREAM: input_stream_ended
        empties, window = engine.align(heads)
        for w in (*empties, window):
            engine.begin(w); (process, input_window_ended per port of w); end = engine.end(w)
            if end.checkpoint: save the state; engine.checkpointed(w)
    flush = engine.flush_window()                         # then the same for it, last=True
    engine.end_stream(); final checkpoint; wait for commit(); engine.teardown()
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple, Protocol

import pyarrow as pa

from weir.operators.dead_letters import dead_letters_of
from weir.operators.operator import InputOperator, Operator, OperatorContext
from weir.operators.watermarks import NO_WATERMARK
from weir.operators.windows import (
    application_window_position,
    format_window_id,
    make_window_id,
    window_base_seconds,
    window_counter,
)
from weir.runtime.event_time import SourceEventTimes, operator_watermarks
from weir.runtime.process_calls import ProcessCalls, rows_may_be_at_fault

__all__ = ["Output", "WindowEnd", "WindowEngine"]

_LOGGER = logging.getLogger(__name__)


class Output(Protocol):
    """Where an output port's windows go: a buffer server's publisher in a container, the
    downstream operators' input in the local runner."""

    def begin_window(self, window_id: int) -> None: ...
    def data(self, window_id: int, batch: pa.RecordBatch) -> None: ...
    def end_window(self, window_id: int, watermark: int = ...) -> None: ...
    def end_stream(self, watermark: int = ...) -> None: ...


class WindowEnd(NamedTuple):
    """What ending a window left the driver to do."""

    watermark: int
    checkpoint: bool  # save the state now (then ``checkpointed``)


class WindowEngine:
    """One operator's window rules.

    Args:
        operator: the instance (restored from ``resume_window``'s checkpoint, if any).
        context: what ``setup`` gets; names the operator, holds its attributes.
        inputs: its connected input ports.
        outputs: its connected output ports (ports not among them go nowhere, said once).
        resume_window: the checkpoint it was restored from (-1: a fresh start).
        skip_missed_windows: restored, it resumes at the current window, not the one
            after the checkpoint (AT_MOST_ONCE): no empty windows fill the gap.
        record_error: whether an error of ``process`` may be the rows' fault (dead letters).
    """

    def __init__(self, operator: Operator, context: OperatorContext, inputs: Iterable[str],
                 outputs: Mapping[str, Output], *, resume_window: int = -1,
                 skip_missed_windows: bool = False,
                 record_error: Callable[[BaseException], bool] = rows_may_be_at_fault) -> None:
        self.operator = operator
        self.context = context
        self.name = context.name
        self.inputs = list(inputs)
        self.outputs = dict(outputs)
        self.resume_window = resume_window
        self.skip_missed_windows = skip_missed_windows
        self.is_source = isinstance(operator, InputOperator)
        self.app_window_count = context.application_window_count
        self.checkpoint_window_count = int(context.attributes.get("CHECKPOINT_WINDOW_COUNT", 20))
        self.dead_letters = dead_letters_of(operator, context)  # ON_ERROR="DEAD_LETTER"
        declared = operator.input_ports()  # batches are cast to a declared schema, or fail
        self.calls = ProcessCalls(operator, self.name, {
            port: declared[port].schema for port in self.inputs
            if port in declared and declared[port].schema is not None}, self.dead_letters,
            record_error)
        # the operator's watermark: its own from a checkpoint, or a new one (state)
        self.marks = operator_watermarks(operator, self.inputs, context.attributes)
        self.event_times: SourceEventTimes | None = None  # a source's, from setup on
        self.window = -1  # the window begun last
        self.last_ended = resume_window  # the window ended last
        self.windows_done = 0  # since this engine started
        self.app_position = 0  # streaming windows into the current application window
        self.checkpoint_due = False
        self.last_checkpoint = -1
        self.committed_window = -1  # the newest ``committed`` delivered
        self.ended_at = -1  # the newest window an input's END_STREAM says its stream reached
        self.suspended = False  # the stream ends for a savepoint: no END_OF_TIME
        self.rows_in: dict[str, int] = dict.fromkeys(self.inputs, 0)
        self.rows_out: dict[str, int] = dict.fromkeys(self.outputs, 0)
        self.emitted = 0  # rows emitted on connected ports, all windows
        self._unconnected = dict.fromkeys(  # unconnected port -> rows there were said to
            set(operator.output_ports()) - set(self.outputs), False)  # go nowhere
        operator.connect_outputs(self._emit)

    # -- lifecycle -----------------------------------------------------------------
    def setup(self) -> None:
        """``setup``; a source with EVENT_TIME_COLUMN reads event times off its output."""
        self.operator.setup(self.context)
        if self.is_source and self.marks.event_time_column:
            declared = self.operator.output_ports()
            self.event_times = SourceEventTimes(
                self.marks, f"operator {self.name!r}",
                {port: declared[port].schema if port in declared else None
                 for port in self.outputs}, self.operator.WATERMARK_SPLITS)  # type: ignore[attr-defined]

    def activate(self) -> None:
        """``activate``: after ``setup``, before the first window (the sources may run)."""
        self.operator.activate(self.context)

    def teardown(self) -> None:
        self.operator.teardown()

    def first_window(self, base_seconds: int, counter: int) -> int:
        """A source's first window: after the checkpoint it was restored from (or, with
        ``skip_missed_windows``, the current one ``counter`` if later), else the first of
        the windows an earlier instance logged (replayed), else ``counter``."""
        assert isinstance(self.operator, InputOperator)
        if self.resume_window >= 0:
            after = window_counter(self.resume_window) + 1
            return make_window_id(window_base_seconds(self.resume_window),
                                  max(after, counter) if self.skip_missed_windows else after)
        replay = self.operator.first_window()
        if replay is not None:
            return replay
        return make_window_id(base_seconds, counter)

    # -- one window ----------------------------------------------------------------
    def begin(self, window_id: int) -> None:
        """Begins streaming window ``window_id`` on every output; the operator's
        ``begin_window`` when an application window begins with it."""
        self.window = window_id
        for output in self.outputs.values():
            output.begin_window(window_id)
        if self.app_position == 0:
            self.operator.begin_window(window_id)
            if self.windows_done == 0 and self.resume_window < 0:
                self.app_position = application_window_position(window_id,
                                                                 self.app_window_count)

    def emit_tuples(self) -> bool:
        """One ``emit_tuples`` call of a source; False: it is exhausted."""
        return self.operator.emit_tuples()  # type: ignore[attr-defined]

    def source_exhausted(self) -> None:
        """A source ended: nothing older can come, every event-time window closes."""
        self.marks.ended()

    def conform(self, port: str, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` cast to ``port``'s declared schema (as ``process`` will see it)."""
        return self.calls.conform(port, batch)

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        """Hands an input batch to ``process`` (cast; failing rows set aside)."""
        self.calls.process(port, batch, self.window, self._emit)
        self.rows_in[port] += batch.num_rows

    def input_window_ended(self, port: str, watermark: int) -> None:
        """``port``'s END_WINDOW of the current window, with its watermark."""
        self.marks.saw_input(port, watermark)

    def input_stream_ended(self, port: str, window_id: int, watermark: int) -> None:
        """``port``'s stream ended after ``window_id``: with NO_WATERMARK it holds the
        watermark back no more; with another (a stop for a savepoint) it stays there and
        this operator's stream is suspended too."""
        self.ended_at = max(self.ended_at, window_id)
        if watermark == NO_WATERMARK:
            self.marks.port_ended(port)
        else:
            self.suspended = True

    def end(self, window_id: int, *, last: bool = False) -> WindowEnd:
        """Ends a window: the watermark moves first (``end_window`` sees it), then goes
        downstream with END_WINDOW on every output. ``last``: the stream ends with it (an
        open application window ends too, and the state is checkpointed)."""
        if self.event_times is not None:
            self.event_times.expect_splits(self.operator)  # type: ignore[arg-type]
        watermark = self.marks.advance()
        self.app_position += 1
        if self.app_position >= self.app_window_count or last:
            self.operator.end_window()
            self.app_position = 0
        outgoing = self.marks.outgoing()  # the watermark, or IDLE for an idle source
        for output in self.outputs.values():
            output.end_window(window_id, outgoing)
        self.checkpoint_due |= (window_counter(window_id) + 1) % self.checkpoint_window_count == 0
        checkpoint = (self.checkpoint_due or last) and self.app_position == 0
        if checkpoint:
            self.checkpoint_due = False
        self.last_ended = window_id
        self.windows_done += 1
        return WindowEnd(watermark, checkpoint)

    def checkpointed(self, window_id: int) -> None:
        """The driver saved the state after ``window_id``."""
        self.last_checkpoint = window_id
        self.operator.checkpointed(window_id)

    def commit(self, window_id: int) -> bool:
        """The committed window reaches the operator (between windows); False: it had it."""
        if window_id <= self.committed_window:
            return False
        self.committed_window = window_id
        self.operator.committed(window_id)
        return True

    # -- alignment and the stream's end --------------------------------------------
    def align(self, heads: Mapping[str, int]) -> tuple[range, int]:
        """The next window, given the window each open input begins next: the lowest;
        and the empty windows before it (one input may end before another begins: the
        windows in between are empty; not after a skip of missed windows).

        Raises:
            RuntimeError: windows went back.
        """
        window_id = min(heads.values())
        last = self.last_ended
        if window_id <= last:
            raise RuntimeError(f"window {format_window_id(window_id)} arrived after window "
                               f"{format_window_id(last)}: windows must increase")
        if last < 0 or self.skip_missed_windows:
            return range(0), window_id
        return range(last + 1, window_id), window_id

    def flush_window(self) -> int | None:
        """Every input ended: the window the stream ends in, if one more is needed: it
        ended inside an application window (flushed now), or after windows this operator
        skipped (AT_MOST_ONCE: it ends at the inputs' end too, so that its upstream can
        commit its last window)."""
        if self.app_position or self.ended_at > self.last_ended:
            return max(self.last_ended + 1, self.ended_at)
        return None

    def end_stream(self) -> None:
        """END_STREAM on every output; a suspended stream says its watermark with it
        (never NO_WATERMARK, which says the stream ended: everything downstream closes)."""
        for output in self.outputs.values():
            if self.suspended:
                output.end_stream(max(self.marks.current, NO_WATERMARK + 1))
            else:
                output.end_stream()

    @property
    def final_checkpoint_due(self) -> bool:
        """The stream ended after a window not checkpointed yet (teardown waits for the
        commit of its last window, so ``committed`` reaches it for every window)."""
        return self.window >= 0 and self.last_checkpoint != self.window

    # -- emitting ------------------------------------------------------------------
    def _emit(self, port: str, batch: pa.RecordBatch) -> None:
        output = self.outputs.get(port)
        if output is None:
            if port in self._unconnected:  # nothing subscribes: nothing to keep, but say so
                if batch.num_rows and not self._unconnected[port]:
                    self._unconnected[port] = True
                    _LOGGER.warning("operator=%s emits rows on its output port %r, which is "
                                    "not connected: they go nowhere; connect it to keep "
                                    "them", self.name, port)
                return
            raise KeyError(f"{self.name} has no output port {port!r}")
        if self.window < 0:
            raise RuntimeError(f"{self.name} emitted on {port!r} outside a window")
        if self.calls.hold(port, batch):  # a try of rows that may fail: kept until it passed
            return
        if self.event_times is not None:
            self.event_times.emitted(port, batch)
        if batch.num_rows:
            output.data(self.window, batch)
            self.rows_out[port] += batch.num_rows
            self.emitted += batch.num_rows
