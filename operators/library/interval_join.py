"""``IntervalJoin``: each left row with the right rows of its key whose event time is
within ``[left.ts + lower_ms, left.ts + upper_ms]``.

A ``JoinSides``: a new row meets the other side's rows already waiting in its key's
state (left rows of a window before its right rows, so a pair meets once, when its
second row comes) and then waits itself until no partner can come any more: a left row
until the watermark passes ``ts + upper_ms``, a right row until it passes
``ts - lower_ms``, when an event-time timer drops it. State is bounded by the
watermark and the interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from weir.operators.library.join_sides import JoinSides
from weir.operators.library.key_state import KeyContext, Timer

__all__ = ["IntervalJoin"]


class IntervalJoin(JoinSides):
    """Joins ``left`` and ``right`` rows with equal ``keys`` and
    ``left.ts + lower_ms <= right.ts <= left.ts + upper_ms`` (an inner join; Flink's
    ``intervalJoin(...).between(lower, upper)``). Give the inputs event time upstream.

    Output: the key columns, the left row's other columns, the right row's (a name the
    left side has too gets ``right_prefix``). One output row per pair, once.

    Args:
        keys: the join key column(s), on both sides (or only the left's, with
            ``right_keys``).
        time_column: each side's event-time column (a name, or (left, right)).
        lower_ms, upper_ms: the interval's bounds relative to the left row's time.
        right_prefix: put before a right column whose name the left side has too.
        ttl_millis: see ``KeyedProcess``.
        right_keys: the right side's key columns, when named otherwise (they are left
            out of the output: the left's have the same values).

    Example:
        >>> IntervalJoin("auction", "ts", lower_ms=0, upper_ms=60_000).upper_ms
        60000
    """

    def __init__(self, keys: str | Sequence[str], time_column: str | tuple[str, str],
                 lower_ms: int, upper_ms: int, right_prefix: str = "right_",
                 ttl_millis: int | None = None,
                 right_keys: str | Sequence[str] | None = None) -> None:
        super().__init__(keys, time_column, right_prefix, ttl_millis, right_keys)
        if lower_ms > upper_ms:
            raise ValueError(f"IntervalJoin: lower_ms ({lower_ms}) is after upper_ms "
                             f"({upper_ms}); the interval would be empty")
        self.lower_ms, self.upper_ms = lower_ms, upper_ms

    def closed(self, side: str, ms: np.ndarray) -> np.ndarray:
        """Rows earlier than the watermark: their earliest partners may be gone."""
        return ms < self.fired_watermark

    def _expiry(self, side: str, ts: int) -> int:
        """When no partner of a ``side`` row at ``ts`` can come any more."""
        return ts + (self.upper_ms if side == "left" else -self.lower_ms) + 1

    def join_rows(self, key: Any, side: str, rows: list[tuple[int, tuple[Any, ...]]],
                  ctx: KeyContext) -> None:
        other = "right" if side == "left" else "left"
        mine, theirs = ctx.state[side], ctx.state[other]
        for ts, row in rows:
            for their_ts, partners in theirs.items():
                left_ts, right_ts = (ts, their_ts) if side == "left" else (their_ts, ts)
                if left_ts + self.lower_ms <= right_ts <= left_ts + self.upper_ms:
                    for partner in partners:
                        left, right = (row, partner) if side == "left" else (partner, row)
                        self.pair(ctx, left, right)
            expiry = self._expiry(side, ts)
            waiting = mine.get(ts)
            if waiting is None:
                waiting = []
                ctx.timers.event_time(expiry)
            waiting.append(row)
            mine[ts] = waiting

    def on_timer(self, key: Any, timer: Timer, ctx: KeyContext) -> None:
        for side in ("left", "right"):
            ts = timer.time - 1 - (self.upper_ms if side == "left" else -self.lower_ms)
            if ts in ctx.state[side]:
                del ctx.state[side][ts]
