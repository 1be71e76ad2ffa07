"""The runner's half of in-band watermarks (``operators.watermarks``): each operator's
``Watermarks`` made or taken over from its checkpoint, and a source's event times read off
the batches it emits. Used by the container's window loop and by the local test runner
(``runtime.local.run``), so both compute watermarks alike.

The ``Watermarks`` lives on the operator (an instance attribute), so a checkpoint saves it
and a restored operator goes on from it; only the ports it counts are the runner's to set,
since a redeploy may connect other ones (a unifier after a repartition).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from weir.operators.operator import InputOperator, Operator
from weir.operators.watermarks import (
    NO_WATERMARK,
    WATERMARKS_ATTRIBUTE,
    Watermarks,
    event_time_error,
    event_times_ms,
)

__all__ = ["EventTimeError", "SourceEventTimes", "merged_watermarks", "operator_watermarks"]


class EventTimeError(ValueError):
    """A source's EVENT_TIME_COLUMN cannot be read off what it emits (missing, or not a
    timestamp): the same on every retry, so the application fails at once."""


def operator_watermarks(operator: Operator, ports: Iterable[str],
                        attributes: Mapping[str, Any]) -> Watermarks:
    """The operator's ``Watermarks``, over the input ``ports`` connected now.

    A fresh operator gets a new one from its EVENT_TIME_COLUMN and WATERMARK_DELAY_MILLIS;
    a restored one keeps its own (its watermark goes on from the checkpoint). Ports it
    counted that are not connected any more are dropped (they would hold it back for
    good); new ones count from no watermark until their first END_WINDOW.
    """
    marks = operator.__dict__.get(WATERMARKS_ATTRIBUTE)
    names = list(ports)
    if not isinstance(marks, Watermarks):
        marks = Watermarks(names, str(attributes.get("EVENT_TIME_COLUMN") or ""),
                           int(attributes.get("WATERMARK_DELAY_MILLIS") or 0),
                           split=bool(getattr(operator, "WATERMARK_SPLITS", ())))
        operator.__dict__[WATERMARKS_ATTRIBUTE] = marks
    marks.connect(names)
    marks.idle_windows = idle_windows(attributes)
    return marks


def idle_windows(attributes: Mapping[str, Any]) -> int:
    """IDLE_TIMEOUT_MILLIS in streaming windows, rounded up (0 = never idle)."""
    timeout_ms = int(attributes.get("IDLE_TIMEOUT_MILLIS") or 0)
    window_ms = int(attributes.get("STREAMING_WINDOW_SIZE_MILLIS") or 500)
    return -(-timeout_ms // window_ms) if timeout_ms > 0 else 0


def merged_watermarks(partitions: Sequence[Operator]) -> Watermarks | None:
    """A new partition's ``Watermarks`` from the old partitions' (a repartition): the
    lowest of each figure, so it claims no more than any of them did; None when one of
    them has none (a checkpoint from before watermarks): the partition starts afresh."""
    marks = [p.__dict__.get(WATERMARKS_ATTRIBUTE) for p in partitions]
    if not marks or not all(isinstance(m, Watermarks) for m in marks):
        return None
    merged = copy.deepcopy(marks[0])
    merged.current = min(m.current for m in marks)
    merged.highest_event_ms = min(m.highest_event_ms for m in marks)
    ports = dict.fromkeys(port for m in marks for port in m.inputs)
    merged.inputs = {port: min(m.inputs.get(port, NO_WATERMARK) for m in marks)
                     for port in ports}
    return merged


class SourceEventTimes:
    """Feeds a source's ``Watermarks`` with the event times of the batches it emits.

    An output port carries event time when its declared schema, or else its first batch,
    has the column; batches of the other ports are not looked at. When no connected port
    can carry it, the source fails (at setup when the declared schemas say so, else at
    the first batch that leaves no port), naming the operator and the fix.

    Args:
        marks: the source's watermarks (``event_time_column`` set).
        owner: names the operator in errors.
        ports: its connected output ports and their declared schemas (None: undeclared).
        split_columns: the columns naming a row's split (``InputOperator.WATERMARK_SPLITS``),
            tracked apart when ``marks`` has splits and a batch has every one of them.

    Raises:
        EventTimeError: the declared schemas already rule every port out.
    """

    def __init__(self, marks: Watermarks, owner: str,
                 ports: Mapping[str, pa.Schema | None],
                 split_columns: Sequence[str] = ()) -> None:
        self.marks = marks
        self.split_columns = list(split_columns)
        self.column = marks.event_time_column
        self.owner = f"{owner} (EVENT_TIME_COLUMN)"
        self._ports = frozenset(ports)
        self._carrying: set[str] = set()
        self._without: set[str] = set()
        for port, schema in ports.items():
            if schema is not None:
                self._classify(port, schema)

    def _classify(self, port: str, schema: pa.Schema) -> None:
        problem = event_time_error(schema, self.column, self.owner)
        if self.column in schema.names:
            if problem:
                raise EventTimeError(f"{problem} (output port {port!r})")
            self._carrying.add(port)
            return
        self._without.add(port)
        if problem and self._without >= self._ports:
            raise EventTimeError(problem)

    def emitted(self, port: str, batch: pa.RecordBatch | pa.Table) -> None:
        """``batch`` went out on ``port``: its highest event time counts."""
        if port not in self._carrying:
            if port in self._without:
                return
            self._classify(port, batch.schema)
            if port not in self._carrying:
                return
        index = batch.schema.get_field_index(self.column)
        if index < 0:
            raise EventTimeError(f"{self.owner}: a batch on output port {port!r} has no "
                                 f"event-time column {self.column!r} although the port's "
                                 "earlier ones had; every batch of a port needs it")
        if batch.num_rows:
            self.marks.saw_event_times(event_times_ms(batch.column(index)),
                                       self._splits(batch))

    def expect_splits(self, source: InputOperator) -> None:
        """Registers the splits ``source`` reads now (``watermark_splits``)."""
        if self.split_columns and self.marks.splits is not None:
            self.marks.expect_splits(source.watermark_splits())

    def _splits(self, batch: pa.RecordBatch | pa.Table) -> pa.Array | None:
        """Each row's split as one value (the split columns joined), or None."""
        if not self.split_columns or self.marks.splits is None or not all(
                name in batch.schema.names for name in self.split_columns):
            return None
        columns = [batch.column(name) for name in self.split_columns]
        if len(columns) == 1:
            return columns[0]
        return pc.binary_join_element_wise(*[pc.cast(c, pa.string()) for c in columns], "/")
