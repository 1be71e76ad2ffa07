"""``RegularJoin``: every pair of left and right rows with equal keys, with no time bound.

A ``JoinSides`` without event time: each row meets the other side's rows of its key
already in the state (left rows of a window before its right rows, so each pair meets
once, when its second row comes) and stays for later ones. Nothing bounds the state but
``ttl_millis``: a key's rows are forgotten once no row of that key came for that long on
the application's clock (Flink's state TTL), so it is required.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from weir.operators.library.join_sides import JoinSides
from weir.operators.library.key_state import KeyContext

__all__ = ["RegularJoin"]


class RegularJoin(JoinSides):
    """An unbounded inner join of ``left`` and ``right`` on ``keys``, its state bounded by
    ``ttl_millis``. Output: the key columns, the left row's other columns, the right
    row's (a name the left has too gets ``right_prefix``).

    Args:
        keys: the join key column(s) (or only the left's, with ``right_keys``).
        ttl_millis: forget a key's rows when no row of the key came for this long.
        right_prefix, right_keys: as for ``WindowJoin``.

    Example:
        >>> RegularJoin("user", ttl_millis=3_600_000).ttl_millis
        3600000
    """

    def __init__(self, keys: str | Sequence[str], ttl_millis: int,
                 right_prefix: str = "right_",
                 right_keys: str | Sequence[str] | None = None) -> None:
        if not isinstance(ttl_millis, int) or ttl_millis < 1:
            raise ValueError("RegularJoin: ttl_millis is required (a positive number of "
                             "milliseconds): without it the state grows for ever")
        super().__init__(keys, None, right_prefix, ttl_millis, right_keys)

    def closed(self, side: str, ms: np.ndarray) -> np.ndarray:
        return np.zeros(len(ms), dtype=bool)

    def join_rows(self, key: Any, side: str, rows: list[tuple[int, tuple[Any, ...]]],
                  ctx: KeyContext) -> None:
        other = "right" if side == "left" else "left"
        mine, theirs = ctx.state[side], ctx.state[other]
        partners = theirs.get(0) or []
        waiting = mine.get(0) or []
        for _, row in rows:
            for partner in partners:
                left, right = (row, partner) if side == "left" else (partner, row)
                self.pair(ctx, left, right)
            waiting.append(row)
        mine[0] = waiting
