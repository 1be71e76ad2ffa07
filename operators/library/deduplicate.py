"""``Deduplicate``: the first row of each key within an event-time horizon, once.

A ``KeyedProcess``: a key's first row goes out in the window it arrives in and the key
remembers its event time; every later row of the key before the watermark passes that
time plus ``within_ms`` is a duplicate and goes to the ``duplicates`` port (counted in
``duplicates``, never silently dropped); after that the key is forgotten, and its next row
is a first again.

State is one store row per key, its value the first row's event time (an integer, not a
pickled state: this operator reads and writes its rows itself). A key past its horizon
counts as absent when it is looked up, so no timer row per key is written: measured on
q18's 4.6 M bids (2.9 M pairs, windows of 920 k rows), the timer rows and their undo
entries were half of the store's writes and a third of the Python per key. The keys past
their horizon are swept out of the store (as deletions in the window's transaction, so a
replay undoes them) each time the horizon's bound moved half of ``within_ms``: the store
holds at most one and a half horizons of keys.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from weir.operators.library.key_state import ValueState
from weir.operators.library.keyed_process import KeyedProcess, no_gc_pauses
from weir.operators.ports import OutputPort, SchemaMismatch
from weir.operators.watermarks import END_OF_TIME, NO_WATERMARK, event_times_ms

__all__ = ["Deduplicate"]

_STATE_ROWS = (b"s", b"t")
"""The store's range of key state rows (``key_state.state_row``: ``s`` + the key)."""


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
    METRICS: ClassVar[tuple[str, ...]] = ("keys_forgotten", "duplicate_rows")
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
        self.keys_forgotten = 0
        # keys whose first row is at or before this are forgotten: the last window's
        # watermark less the horizon (checkpointed, so a replay sees the same)
        self.forgotten_through = NO_WATERMARK
        self.swept_through = NO_WATERMARK  # the bound of the last sweep of the store

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
        the store holds the key within its horizon; then the horizon moves to this
        window's watermark. One store read and one transaction per window; no Python per
        row, and per key only its stored row's name."""
        window_id: int = self._window_id
        batches, self._batches = self._batches, {}
        changes: dict[bytes, int | None] = {}
        rows = pa.Table.from_batches(batches["input"]) if batches.get("input") else None
        watermark = self.watermark
        if rows is not None:
            rows = self.arrived("input", rows)
            with no_gc_pauses():
                keep = self._firsts(rows, watermark, changes)
            if keep.any():
                self.output.emit(rows.filter(pa.array(keep)))
            repeats = int((~keep).sum())
            if repeats:
                self.duplicate_rows += repeats
                self.duplicates.emit(rows.filter(pa.array(~keep)))
        if watermark != END_OF_TIME:  # once the input ended no row comes: no sweep needed
            self.forgotten_through = max(self.forgotten_through, watermark - self.within_ms)
            self._sweep(changes)
        self.commit_window(window_id, changes)

    def _firsts(self, rows: pa.Table, watermark: int, changes: dict[bytes, int | None]
                ) -> np.ndarray:
        """Which rows are firsts; the new keys' first event times into ``changes``."""
        n = rows.num_rows
        times = event_times_ms(rows.column(self.time_column))
        keep = times.is_null().to_numpy(zero_copy_only=False)  # no event time: kept
        indexed = rows.select(list(self.keys)).append_column("__row", pa.array(np.arange(n)))
        timed = indexed.filter(pc.invert(times.is_null())) if keep.any() else indexed
        firsts = timed.group_by(list(self.keys), use_threads=False).aggregate(
            [("__row", "min")])
        at = firsts["__row_min"].to_numpy()
        dumps = pickle.dumps
        names = [b"s" + dumps(key, protocol=5)  # key_state.state_row, inlined: per key
                 for key in zip(*(firsts[k].to_pylist() for k in self.keys), strict=True)]
        stored = self.store.fetch(names)
        gone = self.forgotten_through
        absent = np.fromiter((stored.get(name, gone) <= gone for name in names),
                             dtype=bool, count=len(names))
        new_at = at[absent]
        keep[new_at] = True
        first_ms = times.to_numpy(zero_copy_only=False)[new_at].astype(np.int64)
        remembered = first_ms + self.within_ms > watermark  # else forgotten at once
        new_names = [name for name, new in zip(names, absent.tolist(), strict=True) if new]
        changes.update(zip((name for name, kept in zip(new_names, remembered.tolist(),
                                                      strict=True) if kept),
                           first_ms[remembered].tolist(), strict=True))
        return keep

    def _sweep(self, changes: dict[bytes, int | None]) -> None:
        """Deletes the stored keys past their horizon once its bound moved half of
        ``within_ms`` since the last sweep (a lookup already counts them as absent)."""
        bound = self.forgotten_through
        if bound == NO_WATERMARK or bound - self.swept_through < self.within_ms // 2:
            return
        gone = [name for name in self.store.keys_through(*_STATE_ROWS, bound)
                if name not in changes]
        changes.update(dict.fromkeys(gone))
        self.keys_forgotten += len(gone)
        self.swept_through = bound
