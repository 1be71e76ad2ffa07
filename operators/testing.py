"""For tests: a source of given windows, a sink that keeps what it got, and ``run_local``,
which runs a whole DAG in this process (``runtime.local.run``).

>>> src = ListSource([[{"x": 1}, {"x": 2}], []])
>>> sink = CollectSink()
>>> sorted(src.output_ports()), sorted(sink.input_ports())
(['output'], ['input'])
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from weir.operators.operator import InputOperator, Operator
from weir.operators.ports import InputPort, OutputPort
from weir.runtime.local.run import LocalRun, LocalRunError, run_local

__all__ = ["CollectSink", "ListSource", "LocalRun", "LocalRunError", "run_local"]

_LOGGER = logging.getLogger(__name__)

WindowData = list[dict[str, Any]] | pa.RecordBatch | pa.Table


class ListSource(InputOperator):
    """Emits one element of ``windows`` per streaming window, then ends the stream.

    Use it to feed a DAG or an operator known data in tests. Each element is a list of row
    dicts (turned into a batch with ``schema``, or an inferred one), a RecordBatch or a
    Table; an empty list makes an empty window. The stream ends with the last element's
    window.

    Args:
        windows: the data of each window, in order.
        schema: the schema of rows given as dicts (default: inferred per window).

    Example:
        >>> ListSource([[{"word": "a"}], [{"word": "b"}, {"word": "c"}]]).remaining
        2
    """

    output = OutputPort()

    def __init__(self, windows: Sequence[WindowData], schema: pa.Schema | None = None) -> None:
        self.windows = list(windows)
        self.schema = schema
        self.next_index = 0
        self._emitted_in_window = False

    @property
    def remaining(self) -> int:
        """Windows not emitted yet."""
        return len(self.windows) - self.next_index

    def begin_window(self, window_id: int) -> None:
        self._emitted_in_window = False

    def emit_tuples(self) -> bool:
        if not self._emitted_in_window and self.next_index < len(self.windows):
            data = self.windows[self.next_index]
            self.next_index += 1
            self._emitted_in_window = True
            if isinstance(data, pa.RecordBatch | pa.Table):
                if data.num_rows:
                    self.output.emit(data)
            elif data:
                self.output.emit(pa.RecordBatch.from_pylist(list(data), schema=self.schema))
        return self.next_index < len(self.windows)


class CollectSink(Operator):
    """Keeps every batch it receives, per application window, in memory.

    Use it to check what reaches a port in an in-process test (its contents stay in the
    process that runs it).

    Example:
        >>> sink = CollectSink()
        >>> sink.begin_window(7)
        >>> sink.process("input", pa.record_batch({"x": [1, 2]}))
        >>> sink.end_window()
        >>> sink.rows()
        [{'x': 1}, {'x': 2}]
    """

    input = InputPort()

    def __init__(self) -> None:
        self.windows: list[int] = []
        self.batches: dict[int, list[pa.RecordBatch]] = {}
        self.ended = 0

    def begin_window(self, window_id: int) -> None:
        self.windows.append(window_id)
        self._current = window_id

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        window = self.__dict__.get("_current", -1)
        self.batches.setdefault(window, []).append(batch)

    def end_window(self) -> None:
        self.ended += 1

    def tables(self) -> dict[int, pa.Table]:
        """One table per window that received batches, by window id."""
        return {w: pa.Table.from_batches(bs) for w, bs in self.batches.items() if bs}

    def table(self) -> pa.Table | None:
        """Everything received, in window order (None if nothing)."""
        tables = [t for _, t in sorted(self.tables().items())]
        return pa.concat_tables(tables, promote_options="permissive") if tables else None

    def rows(self, window_id: int | None = None) -> list[dict[str, Any]]:
        """The rows of one window, or of all windows in window order."""
        if window_id is not None:
            return [r for b in self.batches.get(window_id, []) for r in b.to_pylist()]
        return [r for w in sorted(self.batches) for b in self.batches[w] for r in b.to_pylist()]
