"""``WindowJoin``: rows of two streams with equal keys in the same event-time window.

A ``KeyedProcess`` over two ports: each row joins the windows it falls in (one tumbling
window, or every sliding window holding it) and waits in its key's state; when the
watermark passes a window's end, an event-time timer emits every pair of the key's left
and right rows of that window and drops them. State is bounded by the watermark: rows of
windows that are still open. A row whose windows all closed before it came goes to the
``late`` port, counted in ``late_rows``; none is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from weir.operators.library.key_state import KeyContext, MapState, Timer
from weir.operators.library.keyed_process import KeyedProcess
from weir.operators.ports import InputPort, OutputPort, SchemaMismatch
from weir.operators.watermarks import NO_WATERMARK, event_times_ms

__all__ = ["WindowJoin"]

_SIDES = ("left", "right")


class WindowJoin(KeyedProcess):
    """Joins ``left`` and ``right`` rows with equal ``keys`` in the same event-time window
    (an inner join). Give the inputs event time upstream (``EVENT_TIME_COLUMN`` on their
    sources); the watermark closes windows as in ``EventTimeWindows``.

    Output: the key columns, the left row's other columns, the right row's (a name the
    left side has too gets ``right_prefix``), ``window_start`` and ``window_end`` (epoch
    ms). One output row per pair, in each window once.

    Args:
        keys: the join key column(s), on both sides.
        time_column: each side's event-time column (a name, or (left, right)).
        size_ms: the window's length.
        slide_ms: a sliding window's step (None: tumbling windows).
        right_prefix: put before a right column whose name the left side has too.

    Example:
        >>> WindowJoin(keys="seller", time_column="ts", size_ms=10_000).windows_of(12_345)
        [10000]
    """

    left = InputPort()
    right = InputPort()
    late = OutputPort()

    STATE: ClassVar[dict[str, Any]] = {side: MapState(pa.int64(), None) for side in _SIDES}
    COLUMNS_READ: ClassVar[tuple[str, ...]] = ("keys",)
    METRICS: ClassVar[tuple[str, ...]] = ("timers_fired", "late_rows")

    def __init__(self, keys: str | Sequence[str], time_column: str | tuple[str, str],
                 size_ms: int, slide_ms: int | None = None, right_prefix: str = "right_",
                 ttl_millis: int | None = None) -> None:
        super().__init__(keys, ttl_millis)
        times = (time_column, time_column) if isinstance(time_column, str) else time_column
        if len(times) != 2 or not all(isinstance(t, str) and t for t in times):
            raise ValueError(f"WindowJoin: time_column is a column name or a (left, right) "
                             f"pair of names, not {time_column!r}")
        slide = size_ms if slide_ms is None else slide_ms
        if size_ms <= 0 or slide <= 0 or slide > size_ms:
            raise ValueError(f"WindowJoin: size_ms must be positive and slide_ms in "
                             f"(0, size_ms]; got size_ms={size_ms}, slide_ms={slide_ms}")
        self.time_columns = dict(zip(_SIDES, times, strict=True))
        self.size_ms, self.slide_ms = size_ms, slide
        self.right_prefix = right_prefix
        self.schemas: dict[str, pa.Schema] = {}  # each side's, from its first rows
        self.fired_watermark = NO_WATERMARK
        self.late_rows = 0

    def windows_of(self, ts: int) -> list[int]:
        """The starts of the windows holding event time ``ts``."""
        last = ts - ts % self.slide_ms
        return list(range(last, ts - self.size_ms, -self.slide_ms))[::-1]

    # -- schemas -------------------------------------------------------------------------
    def output_schema(self) -> pa.Schema:
        missing = [side for side in _SIDES if side not in self.schemas]
        if missing:
            raise SchemaMismatch(f"WindowJoin: no rows came on {missing} yet, so its output "
                                 "columns are not known")
        left, right = self.schemas["left"], self.schemas["right"]
        fields = [left.field(k) for k in self.keys]
        fields += [f for f in left if f.name not in self.keys]
        fields += [f.with_name(self._right_name(f.name)) for f in right
                   if f.name not in self.keys]
        fields += [pa.field("window_start", pa.int64()), pa.field("window_end", pa.int64())]
        return pa.schema(fields)

    def _right_name(self, name: str) -> str:
        return self.right_prefix + name if name in self.schemas["left"].names else name

    # -- rows ----------------------------------------------------------------------------
    def arrived(self, port: str, rows: pa.Table) -> pa.Table:
        """Records the side's schema; sends the rows whose every window closed already to
        ``late``; the rest wait in state."""
        column = self.time_columns[port]
        if column not in rows.column_names:
            raise SchemaMismatch(f"WindowJoin: the {port} input has no time column "
                                 f"{column!r}; its columns are {rows.column_names}")
        schema = self.schemas.get(port)
        if schema is None:
            self.schemas[port] = schema = rows.schema
        elif rows.schema != schema:
            rows = rows.select(schema.names).cast(schema)
        times = event_times_ms(rows.column(column)).combine_chunks() \
            if rows.num_rows else pa.array([], pa.int64())
        untimed = pc.is_null(times).to_numpy(zero_copy_only=False)
        ms = pc.fill_null(times, 0).to_numpy()
        closed = ms - ms % self.slide_ms + self.size_ms <= self.fired_watermark
        reasons = np.where(untimed, f"no {column} (event time)",
                           np.where(closed, f"its {port} window ended before it came", ""))
        late = untimed | closed
        if late.any():
            self.late_rows += int(late.sum())
            self.late.emit(rows.filter(pa.array(late)).append_column(
                "late_reason", pa.array(reasons[late], pa.string())))
            rows = rows.filter(pa.array(~late))
        return rows

    def process_key(self, key: Any, rows: pa.Table, ctx: KeyContext) -> None:
        side = ctx.port
        assert side is not None
        times = event_times_ms(rows.column(self.time_columns[side])).to_pylist()
        values = [tuple(r) for r in zip(*(rows.column(n).to_pylist()
                                          for n in self.schemas[side].names), strict=True)]
        windows = ctx.state[side]
        for ts, row in zip(times, values, strict=True):
            for start in self.windows_of(ts):
                waiting = windows.get(start)
                if waiting is None:
                    waiting = []
                    ctx.timers.event_time(start + self.size_ms)
                waiting.append(row)
                windows[start] = waiting

    def on_timer(self, key: Any, timer: Timer, ctx: KeyContext) -> None:
        start = timer.time - self.size_ms
        left, right = (ctx.state[side].get(start) or [] for side in _SIDES)
        for side in _SIDES:
            if start in ctx.state[side]:
                del ctx.state[side][start]
        if not left or not right:
            return
        lnames, rnames = self.schemas["left"].names, self.schemas["right"].names
        rkeep = [(i, self._right_name(n)) for i, n in enumerate(rnames) if n not in self.keys]
        for lrow in left:
            base = dict(zip(lnames, lrow, strict=True))
            for rrow in right:
                ctx.emit(base, **{name: rrow[i] for i, name in rkeep},
                         window_start=start, window_end=timer.time)

    def end_window(self) -> None:
        super().end_window()
        self.fired_watermark = max(self.fired_watermark, self.watermark)

