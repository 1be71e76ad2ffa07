"""Nexmark q9's winning bids on Weir, as a user writes them with ``KeyedProcess``: each
auction's highest bid made between its start and its expiry (the earliest of equal
ones), out when the watermark passes the expiry.

Keyed by auction (the auctions' ``id``, the bids' ``auction``). A key keeps its auction,
its best bid so far and the bids that came before their auction; an event-time timer at
the expiry sends the winner and forgets the key. A bid that came before its auction can
only win if the auction starts at or before the bid; an auction that comes after the
watermark passed the bid starts later than the bid (no event is later than the
watermark when it comes), so such bids are forgotten at that point by a second timer.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from weir.operators.library import KeyedProcess, ValueState
from weir.operators.library.key_state import KeyContext, Timer
from weir.operators.ports import InputPort
from weir.operators.watermarks import event_times_ms

__all__ = ["WinningBids"]

_MS = pa.timestamp("ms", tz="UTC")


class WinningBids(KeyedProcess):
    """Ports ``auctions`` (id, seller, category, date_time, expires) and ``bids``
    (auction, bidder, price, date_time); out: each auction with its winning bid."""

    auctions = InputPort()
    bids = InputPort()

    STATE: ClassVar[dict[str, Any]] = {
        "auction": ValueState(None),  # (seller, category, start ms, expires ms)
        "best": ValueState(None),  # (price, -time ms, bidder): the highest tuple wins
        "early": ValueState(None),  # the best bid of those before the auction, per time
    }
    COLUMNS_READ: ClassVar[tuple[str, ...]] = ()
    COLUMNS_READ_BY_PORT: ClassVar[dict[str, tuple[str, ...]]] = {
        "auctions": ("keys",), "bids": ("bid_keys",)}
    OUTPUT = pa.schema([("id", pa.int64()), ("seller", pa.int64()), ("category", pa.int64()),
                        ("expires", _MS), ("bidder", pa.int64()), ("price", pa.int64()),
                        ("bid_date_time", _MS)])

    NON_STATE: ClassVar[tuple[str, ...]] = (*KeyedProcess.NON_STATE, "_columns")

    def __init__(self) -> None:
        super().__init__("id")
        self.bid_keys = ("auction",)

    def keys_of(self, port: str) -> tuple[str, ...]:
        return self.bid_keys if port == "bids" else self.keys

    def process_group(self, key: Any, table: pa.Table, start: int, length: int,
                      ctx: KeyContext) -> None:
        """The key's rows as slices of the window's columns, converted once per window
        (``KeyedProcess``'s hook for that), not per key."""
        cached = self.__dict__.get("_columns")
        if cached is None or cached[0] is not table:
            names = ("seller", "category", "date_time", "expires") if ctx.port == "auctions" \
                else ("price", "date_time", "bidder")
            cached = self._columns = (table, {n: _numbers(table[n]) for n in names})
        cut = {n: v[start:start + length] for n, v in cached[1].items()}
        if ctx.port == "auctions":
            self._auction(ctx, *(int(cut[n][0]) for n in
                                 ("seller", "category", "date_time", "expires")))
        else:
            self._bids(ctx, cut["price"], cut["date_time"], cut["bidder"])

    def end_window(self) -> None:
        super().end_window()
        self._columns = None  # the window's converted columns

    def _auction(self, ctx: KeyContext, seller: int, category: int, start: int,
                 expires: int) -> None:
        ctx.state.auction.update((seller, category, start, expires))
        ctx.timers.event_time(expires + 1)
        early = ctx.state.early.value
        if early:
            ctx.state.early.clear()
            self._offer(ctx, [bid for ts, bid in early.items() if start <= ts <= expires])

    def _bids(self, ctx: KeyContext, price: np.ndarray, ts: np.ndarray,
              bidder: np.ndarray) -> None:
        auction = ctx.state.auction.value
        if auction is not None:
            inside = (ts >= auction[2]) & (ts <= auction[3])
            self._offer(ctx, _best(price[inside], ts[inside], bidder[inside]))
            return
        # before its auction: keep the best bid per time until the watermark passes it
        early = dict(ctx.state.early.value or {})
        for t in np.unique(ts):
            at = ts == t
            early[int(t)] = max([*_best(price[at], ts[at], bidder[at]),
                                 *([early[int(t)]] if int(t) in early else [])])
        ctx.state.early.update(early)
        ctx.timers.event_time(int(ts.max()) + 1)

    def _offer(self, ctx: KeyContext, bids: list[tuple[int, int, int]]) -> None:
        best = max([*bids, *([ctx.state.best.value] if ctx.state.best.value else [])],
                   default=None)
        if best is not None:
            ctx.state.best.update(best)

    def on_timer(self, key: Any, timer: Timer, ctx: KeyContext) -> None:
        auction = ctx.state.auction.value
        if auction is None:  # bids whose auction can no longer include them
            early = {t: b for t, b in (ctx.state.early.value or {}).items() if t >= timer.time}
            if early:
                ctx.state.early.update(early)
            else:
                ctx.state.early.clear()
            return
        if timer.time <= auction[3]:
            return  # an early bid's timer, set before the auction came
        best = ctx.state.best.value
        if best is not None:
            seller, category, _, expires = auction
            ctx.emit_values(key, seller, category, expires, best[2], best[0], -best[1])
        for name in ("auction", "best", "early"):
            getattr(ctx.state, name).clear()


def _numbers(column: pa.ChunkedArray) -> np.ndarray:
    """A column as int64 numbers (times as epoch ms)."""
    return event_times_ms(column).to_numpy() if pa.types.is_timestamp(column.type) \
        else column.to_numpy()


def _best(price: np.ndarray, ts: np.ndarray, bidder: np.ndarray) -> list[tuple[int, int, int]]:
    """The highest bid, the earliest of equal ones, as (price, -time, bidder); [] if none."""
    if not len(price):
        return []
    top = np.flatnonzero(price == price.max())
    i = top[np.argmin(ts[top])]
    return [(int(price[i]), -int(ts[i]), int(bidder[i]))]
