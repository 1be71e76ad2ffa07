"""``Deduplicate``: the first row of each key within an event-time horizon, once.

A ``KeyedProcess``: a key's first row goes out in the window it arrives in and the key
remembers its event time; every later row of the key before the watermark passes that
time plus ``within_ms`` is a duplicate and goes to the ``duplicates`` port (counted in
``duplicates``, never silently dropped); then an event-time timer forgets the key, and
its next row is a first again. State is one row per key seen within the horizon.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from weir.operators.library.key_state import KeyContext, Timer, ValueState
from weir.operators.library.keyed_process import KeyedProcess
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

    STATE: ClassVar[dict[str, Any]] = {"first": ValueState(pa.int64())}
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

    def process_key(self, key: Any, rows: pa.Table, ctx: KeyContext) -> None:
        times = event_times_ms(rows.column(self.time_column)).to_pylist()
        first = ctx.state.first.value
        keep = np.zeros(len(times), dtype=bool)
        for i, ts in enumerate(times):
            if first is None and ts is not None:
                first = ts
                keep[i] = True
                ctx.state.first.update(ts)
                ctx.timers.event_time(ts + self.within_ms)
            elif ts is None:
                keep[i] = True  # no event time: not a repeat of anything known
        if keep.any():
            ctx.emit_table(rows.filter(pa.array(keep)))
        repeats = int((~keep).sum())
        if repeats:
            self.duplicate_rows += repeats
            self.duplicates.emit(rows.filter(pa.array(~keep)))

    def on_timer(self, key: Any, timer: Timer, ctx: KeyContext) -> None:
        ctx.state.first.clear()
