"""One operator of a local run (``operators.local_run``): its window steps, called the way
``container.window_loop`` calls them, with the window's output kept for the operators
downstream instead of published to a buffer server."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from operators.dead_letters import dead_letters_of
from operators.event_time import SourceEventTimes, operator_watermarks
from operators.operator import InputOperator, Operator, OperatorContext
from operators.process_calls import ProcessCalls
from operators.watermarks import NO_WATERMARK
from operators.windows import format_window_id, window_counter

__all__ = ["MAX_EMIT_CALLS", "LocalNode", "LocalRunError"]

_LOGGER = logging.getLogger("operators.local_run")

MAX_EMIT_CALLS = 1_000
"""At most this many ``emit_tuples`` calls per source window under the fast clock."""

Checkpoint = Callable[["LocalNode", int], None]
"""Saves a node's state after a window (the runner's checkpoint store)."""


class LocalRunError(RuntimeError):
    """An operator raised in a local run; the message names it and where (the cause is
    chained)."""


class LocalNode:
    """An operator, its context and its window state in a local run.

    Args:
        name: the operator's name in the DAG.
        operator: the instance (a copy of the DAG's, restored when resuming).
        context: what ``setup`` gets.
        inputs: ``(input port, upstream operator, upstream output port)`` per stream in.
        outputs: its output ports that feed a stream (none: it is a sink).
    """

    def __init__(self, name: str, operator: Operator, context: OperatorContext,
                 inputs: list[tuple[str, str, str]], outputs: set[str]) -> None:
        self.name, self.operator, self.context = name, operator, context
        self.inputs = inputs
        self.is_sink = not outputs
        declared = operator.input_ports()
        dead_letters = dead_letters_of(operator, context)  # ON_ERROR="DEAD_LETTER"
        self.calls = ProcessCalls(operator, name, {  # cast, dead letters: as in containers
            port: declared[port].schema for port, _, _ in inputs
            if port in declared and declared[port].schema is not None}, dead_letters)
        self.marks = operator_watermarks(operator, [port for port, _, _ in inputs],
                                         context.attributes)
        self.event_times: SourceEventTimes | None = None
        self.app_window_count = context.application_window_count
        self.checkpoint_window_count = int(context.attributes["CHECKPOINT_WINDOW_COUNT"])
        self.out: dict[str, list[pa.RecordBatch]] = {port: [] for port in outputs}
        self.out_mark = NO_WATERMARK  # the watermark its END_WINDOW carried
        self.received: dict[int, list[tuple[str, pa.RecordBatch]]] = {}  # a sink's input
        self.processed = False  # it processed the window being run
        self.window = self.last_window = -1
        self.app_position = 0
        self.checkpoint_due = False
        self.last_checkpoint = self.committed = -1
        self.ended = self.torn_down = False
        self.rows_out = 0
        self._closed: set[str] = set()
        self._warned: set[str] = set()
        operator.connect_outputs(self._emit)

    # -- calls into the operator --------------------------------------------------
    def call(self, where: int | str, hook: Callable[..., Any], *args: Any) -> Any:
        """``hook(*args)``; an exception comes back as ``LocalRunError`` naming the
        operator and the window (or the hook, outside windows)."""
        try:
            return hook(*args)
        except LocalRunError:
            raise
        except Exception as exc:  # noqa: BLE001 - any operator error, named
            at = f"window {format_window_id(where)}" if isinstance(where, int) else where
            raise LocalRunError(f"operator {self.name!r} ({type(self.operator).__name__}) "
                                f"failed in {at}: {type(exc).__name__}: {exc}") from exc

    def setup(self) -> None:
        self.operator.setup(self.context)
        if isinstance(self.operator, InputOperator) and self.marks.event_time_column:
            declared = self.operator.output_ports()
            self.event_times = SourceEventTimes(
                self.marks, f"operator {self.name!r}",
                {port: declared[port].schema if port in declared else None
                 for port in self.out}, self.operator.WATERMARK_SPLITS)

    def teardown(self) -> None:
        self.torn_down = True
        self.operator.teardown()

    def _emit(self, port: str, batch: pa.RecordBatch) -> None:
        if self.calls.hold(port, batch):  # a try of rows that may fail: kept until it passed
            return
        if port not in self.out:
            if port not in self.operator.output_ports():
                raise KeyError(f"{self.name} has no output port {port!r}")
            if batch.num_rows and port not in self._warned:
                self._warned.add(port)
                _LOGGER.warning("operator=%s emits rows on its output port %r, which is not "
                                "connected: they go nowhere", self.name, port)
            return
        if self.window < 0:
            raise RuntimeError(f"{self.name} emitted on {port!r} outside a window")
        if self.event_times is not None:
            self.event_times.emitted(port, batch)
        if batch.num_rows:
            self.out[port].append(batch)
            self.rows_out += batch.num_rows

    # -- windows -------------------------------------------------------------------
    def step(self, window_id: int, nodes: Mapping[str, LocalNode], last: bool,
             checkpoint: Checkpoint) -> None:
        """Runs streaming window ``window_id`` (the operators upstream ran it already).

        Args:
            nodes: every node by name, to read the upstream ones' output.
            last: a source ends its stream with this window (``max_windows``).
            checkpoint: saves the state (the runner's store).
        """
        self.processed = False
        self.out = {port: [] for port in self.out}
        if self.ended:
            return
        if isinstance(self.operator, InputOperator):
            self._source_window(window_id, last, checkpoint)
        else:
            self._generic_window(window_id, nodes, checkpoint)

    def _source_window(self, window_id: int, last: bool, checkpoint: Checkpoint) -> None:
        """Fast clock: the window ends when a call emits nothing or the source is done."""
        assert isinstance(self.operator, InputOperator)
        self._begin(window_id)
        exhausted = False
        for _ in range(MAX_EMIT_CALLS):
            before = self.rows_out
            if not self.operator.emit_tuples():
                exhausted = True
                break
            if self.rows_out == before:
                break
        if exhausted:  # nothing older can come: every event-time window closes
            self.marks.ended()
        self._end(window_id, exhausted or last, checkpoint)

    def _generic_window(self, window_id: int, nodes: Mapping[str, LocalNode],
                        checkpoint: Checkpoint) -> None:
        """The window's batches of every input whose upstream ran it, port by port; when
        every upstream has ended, the stream ends here too (flushing an open application
        window in one more window, as the container does)."""
        open_inputs = []
        for port, upstream, upstream_port in self.inputs:
            node = nodes[upstream]
            if node.processed:
                open_inputs.append((port, node.out[upstream_port], node.out_mark))
            elif node.ended and port not in self._closed:
                self._closed.add(port)
                self.marks.port_ended(port)  # it holds the watermark back no more
        if open_inputs:
            self._begin(window_id)
            for port, batches, watermark in open_inputs:
                for batch in batches:
                    self._process(window_id, port, batch)
                self.marks.saw_input(port, watermark)
            if self.is_sink:
                self.received.setdefault(window_id, [])
            self._end(window_id, False, checkpoint)
        elif self.app_position:
            self._begin(window_id)
            self._end(window_id, True, checkpoint)
        else:
            self._finish(checkpoint)

    def _process(self, window_id: int, port: str, batch: pa.RecordBatch) -> None:
        if self.is_sink:
            self.received.setdefault(window_id, []).append(
                (port, self.calls.conform(port, batch)))
        self.calls.process(port, batch, window_id, self._emit)

    def _begin(self, window_id: int) -> None:
        self.window = window_id
        if self.app_position == 0:
            self.operator.begin_window(window_id)

    def _end(self, window_id: int, last: bool, checkpoint: Checkpoint) -> None:
        """The watermark moves first (``end_window`` sees it); checkpoints on an
        application-window boundary every ``CHECKPOINT_WINDOW_COUNT`` windows and at the
        stream's end."""
        if self.event_times is not None:
            self.event_times.expect_splits(self.operator)  # type: ignore[arg-type]
        self.marks.advance()
        self.app_position += 1
        if self.app_position >= self.app_window_count or last:
            self.operator.end_window()
            self.app_position = 0
        self.out_mark = self.marks.outgoing()
        self.processed, self.last_window = True, window_id
        self.checkpoint_due |= (window_counter(window_id) + 1) % self.checkpoint_window_count == 0
        if (self.checkpoint_due or last) and self.app_position == 0:
            self.checkpoint_due = False
            checkpoint(self, window_id)
        if last:
            self._finish(checkpoint)

    def _finish(self, checkpoint: Checkpoint) -> None:
        """END_STREAM: the last window is checkpointed (teardown waits for its commit)."""
        self.ended = True
        if self.last_window >= 0 and self.last_checkpoint != self.last_window:
            checkpoint(self, self.last_window)
