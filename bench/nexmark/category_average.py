"""Nexmark q4's second step on Weir, as a user writes it with ``KeyedProcess``: the
average winning price per category, over the winning bids q9's ``WinningBids`` sends.

Keyed by category, each key keeps the sum and the count of its winners. The result
updates: each window a category gets winners in, its new average goes out, so the last
row of a category is the answer (as Flink's q4 retracts the old one).
"""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from weir.operators.library import KeyedProcess, ValueState
from weir.operators.library.key_state import KeyContext

__all__ = ["CategoryAverage"]


class CategoryAverage(KeyedProcess):
    """Port ``input`` (winning bids: category, price); out: (category, auctions so far,
    their average price)."""

    STATE: ClassVar[dict[str, Any]] = {"total": ValueState(pa.int64()),
                                       "auctions": ValueState(pa.int64())}
    OUTPUT = pa.schema([("category", pa.int64()), ("auctions", pa.int64()),
                        ("avg_price", pa.float64())])

    def __init__(self) -> None:
        super().__init__("category")

    def process_key(self, key: Any, rows: pa.Table, ctx: KeyContext) -> None:
        state = ctx.state
        total = (state.total.value or 0) + pc.sum(rows["price"]).as_py()
        auctions = (state.auctions.value or 0) + rows.num_rows
        state.total.update(total)
        state.auctions.update(auctions)
        ctx.emit(category=key, auctions=auctions, avg_price=total / auctions)
