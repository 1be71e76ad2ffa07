"""``Deduplicate``: the first row of each key within an event-time horizon, once.

A ``KeyedProcess``: a key's first row goes out in the window it arrives in and the key
remembers its event time; every later row of the key before the watermark passes that
time plus ``within_ms`` is a duplicate and goes to the ``duplicates`` port (counted in
``duplicates``, never silently dropped); then an event-time timer forgets the key, and
its next row is a first again. State is one row per key seen within the horizon.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from weir.operators.library.key_state import (
    EVENT,
    ValueState,
    parse_timer_row,
    state_row,
    timer_bound,
    timer_row,
)
from weir.operators.library.keyed_process import KeyedProcess, no_gc_pauses
from weir.operators.ports import OutputPort, SchemaMismatch
from weir.operators.watermarks import event_times_ms

__all__ = ["Deduplicate"]


class Deduplicate(KeyedProcess):
    """Keeps each key's first row within ``within_ms`` of event time (in arrival order);
    the output has the input's columns. A row without event time is kept (it repeats
    nothing known). Give the input event time upstream
    (``EVENT_TIME_COLUMN`` on its source).

    Args:
        keys: what makes two rows the same (a column, or several).
        time_column: the rows' event-time column.
        within_ms: how long after a key's first row its repeats are duplicates.

    Example:
        >>> Deduplicate(keys="bid_id", time_column="ts", within_ms=60_000).keys
        ('bid_id',)
    """

    duplicates = OutputPort()

    STATE: ClassVar[dict[str, ValueState]] = {"first": ValueState(pa.int64())}
    METRICS: ClassVar[tuple[str, ...]] = ("timers_fired", "duplicate_rows")
    COLUMNS_READ: ClassVar[tuple[str, ...]] = ("keys", "time_column")

    def __init__(self, keys: str | Sequence[str], time_column: str, within_ms: int) -> None:
        super().__init__(keys)
        if not isinstance(time_column, str) or not time_column:
            raise ValueError(f"Deduplicate: time_column names a column, not {time_column!r}")
        if within_ms <= 0:
            raise ValueError(f"Deduplicate: within_ms must be positive, not {within_ms}")
        self.time_column = time_column
        self.within_ms = within_ms
        self.schema: pa.Schema | None = None  # the input's, from its first rows
        self.duplicate_rows = 0

    def output_schema(self) -> pa.Schema:
        if self.schema is None:
            raise SchemaMismatch("Deduplicate: no rows came yet, so its output columns "
                                 "are not known")
        return self.schema

    def arrived(self, port: str, rows: pa.Table) -> pa.Table:
        if self.time_column not in rows.column_names:
            raise SchemaMismatch(f"Deduplicate: its input has no time column "
                                 f"{self.time_column!r}; its columns are {rows.column_names}")
        if self.schema is None:
            self.schema = rows.schema
        return rows

    def end_window(self) -> None:
        """The window's rows at once: each key's first row (arrival order) is kept unless
        the store holds the key; then the keys whose horizon the watermark passed are
        forgotten (rows before timers, as ``KeyedProcess`` does). One store read and one
        transaction per window; no Python per row."""
        window_id: int = self._window_id
        batches, self._batches = self._batches, {}
        changes: dict[bytes, bytes | None] = {}
        rows = pa.Table.from_batches(batches["input"]) if batches.get("input") else None
        if rows is not None:
            rows = self.arrived("input", rows)
            with no_gc_pauses():
                keep = self._firsts(rows, window_id, changes)
            if keep.any():
                self.output.emit(rows.filter(pa.array(keep)))
            repeats = int((~keep).sum())
            if repeats:
                self.duplicate_rows += repeats
                self.duplicates.emit(rows.filter(pa.array(~keep)))
        due = self.store.scan(EVENT.encode(), timer_bound(EVENT, self.watermark))
        for row, _ in due:
            changes[row] = None
            changes[state_row(parse_timer_row(row)[2])] = None
        self.timers_fired += len(due)
        self.commit_window(window_id, changes)

    def _firsts(self, rows: pa.Table, window_id: int, changes: dict[bytes, bytes | None]
                ) -> np.ndarray:
        """Which rows are firsts; the new keys' state and timer rows into ``changes``."""
        n = rows.num_rows
        times = event_times_ms(rows.column(self.time_column))
        keep = times.is_null().to_numpy(zero_copy_only=False)  # no event time: kept
        indexed = rows.select(list(self.keys)).append_column("__row", pa.array(np.arange(n)))
        timed = indexed.filter(pc.invert(times.is_null())) if keep.any() else indexed
        firsts = timed.group_by(list(self.keys), use_threads=False).aggregate(
            [("__row", "min")])
        at = firsts["__row_min"].to_numpy()
        keys = list(zip(*(firsts[k].to_pylist() for k in self.keys), strict=True))
        rows_of = [state_row(k) for k in keys]
        stored = self.store.fetch(rows_of, window_id)
        first_ms = times.to_numpy(zero_copy_only=False)
        for key, row, i in zip(keys, rows_of, at.tolist(), strict=True):
            if row in stored:
                continue
            keep[i] = True
            ts = int(first_ms[i])
            if ts + self.within_ms > self.watermark:  # else forgotten at once
                changes[row] = pickle.dumps({"first": ts}, protocol=5)
                changes[timer_row(EVENT, ts + self.within_ms, key)] = b""
        return keep
