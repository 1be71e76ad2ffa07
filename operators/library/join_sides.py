"""What the two-stream joins share (``WindowJoin``, ``IntervalJoin``): the ``left`` and
``right`` ports, each side's rows waiting in its key's state, the output's columns, and
rows too late to meet their partners sent to ``late`` with a reason, never dropped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from weir.operators.library.key_state import KeyContext, MapState
from weir.operators.library.keyed_process import KeyedProcess
from weir.operators.ports import InputPort, OutputPort, SchemaMismatch
from weir.operators.watermarks import NO_WATERMARK, event_times_ms, split_late

__all__ = ["SIDES", "JoinSides"]

SIDES = ("left", "right")


class JoinSides(KeyedProcess):
    """Base of the joins: a subclass says when a side's rows are too late (``closed``),
    what to do with a key's new rows (``process_key``), and may add output columns
    (``EXTRA_FIELDS``). Each side's state is a map from a time to the row tuples waiting
    there (in the side's column order)."""

    left = InputPort()
    right = InputPort()
    late = OutputPort()

    # a time -> the row tuples waiting there; untyped: the operator's own values
    STATE: ClassVar[dict[str, Any]] = {side: MapState(None, None) for side in SIDES}
    NON_STATE: ClassVar[tuple[str, ...]] = (*KeyedProcess.NON_STATE, "_rows", "_orders")
    COLUMNS_READ: ClassVar[tuple[str, ...]] = ()
    COLUMNS_READ_BY_PORT: ClassVar[dict[str, tuple[str, ...]]] = {
        "left": ("keys",), "right": ("right_keys",)}
    METRICS: ClassVar[tuple[str, ...]] = ("timers_fired", "late_rows")
    EXTRA_FIELDS: ClassVar[tuple[pa.Field, ...]] = ()

    def __init__(self, keys: str | Sequence[str], time_column: str | tuple[str, str] | None,
                 right_prefix: str = "right_", ttl_millis: int | None = None,
                 right_keys: str | Sequence[str] | None = None) -> None:
        super().__init__(keys, ttl_millis)
        name = type(self).__name__
        self.right_keys = self.keys if right_keys is None else (
            (right_keys,) if isinstance(right_keys, str) else tuple(right_keys))
        if len(self.right_keys) != len(self.keys):
            raise ValueError(f"{name}: right_keys {list(self.right_keys)} must pair with "
                             f"keys {list(self.keys)}, one column each")
        times = (time_column, time_column) if isinstance(time_column, str | None) \
            else time_column
        if time_column is not None and (  # None: no event time, no row is ever late
                len(times) != 2 or not all(isinstance(t, str) and t for t in times)):
            raise ValueError(f"{name}: time_column is a column name or a (left, right) "
                             f"pair of names, not {time_column!r}")
        self.time_columns = dict(zip(SIDES, times, strict=True))
        self.right_prefix = right_prefix
        self.schemas: dict[str, pa.Schema] = {}  # each side's, from its first rows
        self.fired_watermark = NO_WATERMARK  # the watermark the last window's timers saw
        self.late_rows = 0

    def keys_of(self, port: str) -> tuple[str, ...]:
        return self.right_keys if port == "right" else self.keys

    def closed(self, side: str, ms: np.ndarray) -> np.ndarray:
        """Which rows of ``side`` (event times ``ms``) came after partners of theirs may
        have left the state (the watermark as of the last window: ``fired_watermark``)."""
        raise NotImplementedError

    # -- schemas -------------------------------------------------------------------------
    def output_schema(self) -> pa.Schema:
        missing = [side for side in SIDES if side not in self.schemas]
        if missing:
            raise SchemaMismatch(f"{type(self).__name__}: no rows came on {missing} yet, "
                                 "so its output columns are not known")
        left, right = self.schemas["left"], self.schemas["right"]
        fields = [left.field(k) for k in self.keys]
        fields += [f for f in left if f.name not in self.keys]
        fields += [f.with_name(self._right_name(f.name)) for f in right
                   if f.name not in self.right_keys]
        return pa.schema([*fields, *self.EXTRA_FIELDS])

    def _right_name(self, name: str) -> str:
        return self.right_prefix + name if name in self.schemas["left"].names else name

    # -- rows ----------------------------------------------------------------------------
    def arrived(self, port: str, rows: pa.Table) -> pa.Table:
        """Records the side's schema; sends rows without event time, or too late to meet
        every partner, to ``late``; the rest go on to ``process_key``."""
        column = self.time_columns[port]
        schema = self.schemas.get(port)
        if schema is None:
            self.schemas[port] = schema = rows.schema
        elif rows.schema != schema:
            rows = rows.select(schema.names).cast(schema)
        if column is None:
            return rows
        if column not in rows.column_names:
            raise SchemaMismatch(f"{type(self).__name__}: the {port} input has no time "
                                 f"column {column!r}; its columns are {rows.column_names}")
        rows, late = split_late(rows, column, lambda ms: self.closed(port, ms),
                                f"{port}: its partners' time had passed when it came")
        if late.num_rows:
            self.late_rows += late.num_rows
            self.late.emit(late)
        return rows

    def process_group(self, key: Any, table: pa.Table, start: int, length: int,
                      ctx: KeyContext) -> None:
        """Converts the window's rows of the port to (event time, row tuple) once, then
        hands each key its share (``join_rows``)."""
        side = ctx.port
        assert side is not None
        cached = self.__dict__.get("_rows")
        if cached is None or cached[0] is not table:
            column = self.time_columns[side]
            times = (event_times_ms(table.column(column)).to_pylist() if column is not None
                     else [None] * table.num_rows)
            values = zip(*(table.column(n).to_pylist() for n in self.schemas[side].names),
                         strict=True)
            cached = self._rows = (table, list(zip(times, values, strict=True)))
        self.join_rows(key, side, cached[1][start:start + length], ctx)

    def join_rows(self, key: Any, side: str, rows: list[tuple[int, tuple[Any, ...]]],
                  ctx: KeyContext) -> None:
        """A key's new rows of ``side``: (event time, the row as a tuple), arrival order."""
        raise NotImplementedError

    def pair(self, ctx: KeyContext, left: tuple[Any, ...], right: tuple[Any, ...],
             *extra: Any) -> None:
        """Emits one joined row (``extra``: the values of ``EXTRA_FIELDS``)."""
        orders = self.__dict__.get("_orders")
        if orders is None:
            lnames, rnames = self.schemas["left"].names, self.schemas["right"].names
            orders = self._orders = (
                [lnames.index(k) for k in self.keys] +
                [i for i, n in enumerate(lnames) if n not in self.keys],
                [i for i, n in enumerate(rnames) if n not in self.right_keys])
        ctx.emit_values(*(left[i] for i in orders[0]), *(right[i] for i in orders[1]),
                        *extra)

    def end_window(self) -> None:
        self._rows = None  # the window's table
        super().end_window()
        self.fired_watermark = max(self.fired_watermark, self.watermark)
