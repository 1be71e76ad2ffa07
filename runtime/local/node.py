"""One operator of a local run (``runtime.local.run``): the local driver of its window
engine (``runtime.window_engine``). The engine decides what a container's runner would;
the node only passes each window's output on to the operators downstream, in the same
thread, instead of publishing it to a buffer server."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from weir.operators.column_checks import hide_internal_columns
from weir.operators.operator import Operator, OperatorContext
from weir.operators.watermarks import NO_WATERMARK
from weir.operators.windows import format_window_id
from weir.runtime.window_engine import WindowEngine

__all__ = ["MAX_EMIT_CALLS", "LocalNode", "LocalRunError"]

_LOGGER = logging.getLogger("weir.runtime.local.run")

MAX_EMIT_CALLS = 1_000
"""At most this many ``emit_tuples`` calls per source window under the fast clock."""

Checkpoint = Callable[["LocalNode", int], None]
"""Saves a node's state after a window (the runner's checkpoint store)."""


class LocalRunError(RuntimeError):
    """An operator raised in a local run; the message names it and where (the cause is
    chained)."""


class WindowOutput:
    """An output port's current window, read by the operators downstream in the same pass
    (the engine's ``Output``)."""

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []
        self.watermark = NO_WATERMARK  # what its END_WINDOW carried
        self.end_watermark = NO_WATERMARK  # what its END_STREAM carried

    def begin_window(self, window_id: int) -> None:
        self.batches = []

    def data(self, window_id: int, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)

    def end_window(self, window_id: int, watermark: int = NO_WATERMARK) -> None:
        self.watermark = watermark

    def end_stream(self, watermark: int = NO_WATERMARK) -> None:
        self.end_watermark = watermark


class LocalNode:
    """An operator, its engine and its place in a local run.

    Args:
        name: the operator's name in the DAG.
        operator: the instance (a copy of the DAG's, restored when resuming).
        context: what ``setup`` gets.
        inputs: ``(input port, upstream operator, upstream output port)`` per stream in.
        outputs: its output ports that feed a stream (none: it is a sink).
        resume_window: the checkpoint it was restored from (-1: a fresh start).
    """

    def __init__(self, name: str, operator: Operator, context: OperatorContext,
                 inputs: list[tuple[str, str, str]], outputs: set[str],
                 resume_window: int = -1) -> None:
        self.name, self.operator = name, operator
        self.inputs = inputs
        self.is_sink = not outputs
        self.outputs = {port: WindowOutput() for port in outputs}
        self.engine = WindowEngine(operator, context, [port for port, _, _ in inputs],
                                   self.outputs, resume_window=resume_window)
        self.received: dict[int, list[tuple[str, pa.RecordBatch]]] = {}  # a sink's input
        self.processed = False  # it processed the window being run
        self.ended = self.torn_down = False
        self._closed: set[str] = set()

    @property
    def last_window(self) -> int:
        return self.engine.last_ended

    @property
    def last_checkpoint(self) -> int:
        return self.engine.last_checkpoint

    @property
    def committed(self) -> int:
        return self.engine.committed_window

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
                                f"failed in {at}: {type(exc).__name__}: "
                                f"{hide_internal_columns(str(exc))}") from exc

    def teardown(self) -> None:
        self.torn_down = True
        self.engine.teardown()

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
        if self.ended:
            return
        if self.engine.is_source:
            self._source_window(window_id, last, checkpoint)
        else:
            self._generic_window(nodes, checkpoint)

    def _source_window(self, window_id: int, last: bool, checkpoint: Checkpoint) -> None:
        """Fast clock: the window ends when a call emits nothing or the source is done."""
        engine = self.engine
        engine.begin(window_id)
        exhausted = False
        for _ in range(MAX_EMIT_CALLS):
            before = engine.emitted
            if not engine.emit_tuples():
                exhausted = True
                break
            if engine.emitted == before:
                break
        if exhausted:
            engine.source_exhausted()
        self._end(window_id, exhausted or last, checkpoint)

    def _generic_window(self, nodes: Mapping[str, LocalNode], checkpoint: Checkpoint) -> None:
        """The window every upstream that ran it produced, port by port (the engine
        aligns, as in a container); when every upstream has ended, the stream ends here
        too, in one more window if the engine says so."""
        engine = self.engine
        heads: dict[str, int] = {}
        for port, upstream, upstream_port in self.inputs:
            node = nodes[upstream]
            if node.processed:
                heads[port] = node.last_window
            elif node.ended and port not in self._closed:
                self._closed.add(port)
                engine.input_stream_ended(port, node.last_window,
                                          node.outputs[upstream_port].end_watermark)
        if not heads:
            flush = engine.flush_window()
            if flush is not None:
                engine.begin(flush)
                self._end(flush, True, checkpoint)
            else:
                self._finish(checkpoint)
            return
        empties, window_id = engine.align(heads)
        for empty in empties:
            engine.begin(empty)
            self._end(empty, False, checkpoint)
        engine.begin(window_id)
        for port, upstream, upstream_port in self.inputs:
            if heads.get(port) != window_id:
                continue
            output = nodes[upstream].outputs[upstream_port]
            for batch in output.batches:
                self._process(window_id, port, batch)
            engine.input_window_ended(port, output.watermark)
        if self.is_sink:
            self.received.setdefault(window_id, [])
        self._end(window_id, False, checkpoint)

    def _process(self, window_id: int, port: str, batch: pa.RecordBatch) -> None:
        if self.is_sink:
            batch = self.engine.conform(port, batch)
            self.received.setdefault(window_id, []).append((port, batch))
        self.engine.process(port, batch)

    def _end(self, window_id: int, last: bool, checkpoint: Checkpoint) -> None:
        """Ends the window; the state is saved when the engine says a checkpoint is due."""
        if self.engine.end(window_id, last=last).checkpoint:
            checkpoint(self, window_id)
        self.processed = True
        if last:
            self._finish(checkpoint)

    def _finish(self, checkpoint: Checkpoint) -> None:
        """END_STREAM: the last window is checkpointed (teardown waits for its commit)."""
        self.engine.end_stream()
        self.ended = True
        if self.engine.final_checkpoint_due:
            checkpoint(self, self.engine.window)
