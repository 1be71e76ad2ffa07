"""``WindowJoin``: rows of two streams with equal keys in the same event-time window.

A ``JoinSides``: each row joins the windows it falls in (one tumbling window, or every
sliding window holding it) and waits in its key's state; when the watermark passes a
window's end, an event-time timer emits every pair of the key's left and right rows of
that window and drops them. State is bounded by the watermark: rows of windows that are
still open. A row whose windows all closed before it came goes to ``late``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from weir.operators.library.join_sides import SIDES, JoinSides
from weir.operators.library.key_state import KeyContext, Timer

__all__ = ["WindowJoin"]


class WindowJoin(JoinSides):
    """Joins ``left`` and ``right`` rows with equal ``keys`` in the same event-time window
    (an inner join). Give the inputs event time upstream (``EVENT_TIME_COLUMN`` on their
    sources); the watermark closes windows as in ``EventTimeWindows``.

    Output: the key columns, the left row's other columns, the right row's (a name the
    left side has too gets ``right_prefix``), ``window_start`` and ``window_end`` (epoch
    ms). One output row per pair, in each window once.

    Args:
        keys: the join key column(s), on both sides (or only the left's, with
            ``right_keys``).
        time_column: each side's event-time column (a name, or (left, right)).
        size_ms: the window's length.
        slide_ms: a sliding window's step (None: tumbling windows).
        right_prefix: put before a right column whose name the left side has too.
        ttl_millis: see ``KeyedProcess``.
        right_keys: the right side's key columns, when named otherwise (they are left
            out of the output: the left's have the same values).

    Example:
        >>> WindowJoin(keys="seller", time_column="ts", size_ms=10_000).windows_of(12_345)
        [10000]
    """

    EXTRA_FIELDS: ClassVar[tuple[pa.Field, ...]] = (pa.field("window_start", pa.int64()),
                                                    pa.field("window_end", pa.int64()))

    def __init__(self, keys: str | Sequence[str], time_column: str | tuple[str, str],
                 size_ms: int, slide_ms: int | None = None, right_prefix: str = "right_",
                 ttl_millis: int | None = None,
                 right_keys: str | Sequence[str] | None = None) -> None:
        super().__init__(keys, time_column, right_prefix, ttl_millis, right_keys)
        slide = size_ms if slide_ms is None else slide_ms
        if size_ms <= 0 or slide <= 0 or slide > size_ms:
            raise ValueError(f"WindowJoin: size_ms must be positive and slide_ms in "
                             f"(0, size_ms]; got size_ms={size_ms}, slide_ms={slide_ms}")
        self.size_ms, self.slide_ms = size_ms, slide

    def windows_of(self, ts: int) -> list[int]:
        """The starts of the windows holding event time ``ts``."""
        last = ts - ts % self.slide_ms
        return list(range(last, ts - self.size_ms, -self.slide_ms))[::-1]

    def closed(self, side: str, ms: np.ndarray) -> np.ndarray:
        """Rows whose last window ended before this window's rows came."""
        return ms - ms % self.slide_ms + self.size_ms <= self.fired_watermark

    def process_key(self, key: Any, rows: pa.Table, ctx: KeyContext) -> None:
        side = ctx.port
        assert side is not None
        windows = ctx.state[side]
        for ts, row in self.waiting(side, rows):
            for start in self.windows_of(ts):
                waiting = windows.get(start)
                if waiting is None:
                    waiting = []
                    ctx.timers.event_time(start + self.size_ms)
                waiting.append(row)
                windows[start] = waiting

    def on_timer(self, key: Any, timer: Timer, ctx: KeyContext) -> None:
        start = timer.time - self.size_ms
        left, right = (ctx.state[side].get(start) or [] for side in SIDES)
        for side in SIDES:
            if start in ctx.state[side]:
                del ctx.state[side][start]
        for lrow in left:
            for rrow in right:
                self.pair(ctx, lrow, rrow, window_start=start, window_end=timer.time)
