"""What each query must output, computed from the same events without any streaming
system: the answer every system's output is checked against, exactly.

Each answer is a table of the query's *canonical* columns (times as epoch ms, q1's euro
price as integer thousandths, so nothing is compared as a float), sorted by every
column. Windows follow the spec: tumbling and sliding windows aligned to the epoch,
``start <= t < end``; a session holds a key's rows each less than the gap after the one
before, and ends the gap after its last row.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.nexmark.generator import parquet_dir
from bench.nexmark.model import AUCTION, BID, KINDS, PERSON, QUERIES, NexmarkSpec, inputs_of

__all__ = ["CANONICAL", "USED_COLUMNS", "answer", "closed", "epoch_ms", "read_events", "sort_all"]

_I64, _STR = pa.int64(), pa.string()

CANONICAL: dict[str, pa.Schema] = {
    "q0": pa.schema([("auction", _I64), ("bidder", _I64), ("price", _I64), ("channel", _STR),
                     ("url", _STR), ("date_time", _I64), ("extra", _STR)]),
    "q1": pa.schema([("auction", _I64), ("bidder", _I64), ("price_milli", _I64),
                     ("date_time", _I64), ("extra", _STR)]),
    "q2": pa.schema([("auction", _I64), ("price", _I64)]),
    "q3": pa.schema([("name", _STR), ("city", _STR), ("state", _STR), ("id", _I64)]),
    "q4": pa.schema([("category", _I64), ("auctions", _I64), ("avg_price", pa.float64())]),
    "q5": pa.schema([("auction", _I64), ("num", _I64), ("window_start", _I64)]),
    "q7": pa.schema([("window_start", _I64), ("maxprice", _I64)]),
    "q8": pa.schema([("id", _I64), ("name", _STR), ("window_start", _I64)]),
    "q9": pa.schema([("id", _I64), ("seller", _I64), ("category", _I64), ("expires", _I64),
                     ("price", _I64), ("bid_date_time", _I64)]),
    "q11": pa.schema([("bidder", _I64), ("bid_count", _I64), ("window_start", _I64),
                      ("window_end", _I64)]),
    "q18": pa.schema([("bidder", _I64), ("auction", _I64)]),
    "q19": pa.schema([("auction", _I64), ("window_start", _I64), ("rank", _I64),
                      ("price", _I64)]),
    "q20": pa.schema([("auction", _I64), ("bidder", _I64), ("price", _I64), ("channel", _STR),
                      ("url", _STR), ("date_time", _I64), ("item_name", _STR),
                      ("description", _STR), ("initial_bid", _I64), ("reserve", _I64),
                      ("expires", _I64), ("seller", _I64), ("category", _I64)]),
}
"""Each query's columns as checked: what every system's output is turned into. Where a
tie may let a system pick either of two rows, only columns every pick shares are
checked: q9's winner by its price and time (not its bidder), q18's first bid per
bidder and auction by the pair, q19's top bids by rank and price."""


def epoch_ms(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A timestamp column (any unit, any zone) or epoch-ms integers as epoch-ms int64."""
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms", tz=column.type.tz))
    return column.cast(pa.int64())


USED_COLUMNS: dict[str, dict[str, list[str] | None]] = {
    "q0": {BID: None},
    "q1": {BID: ["auction", "bidder", "price", "date_time", "extra"]},
    "q2": {BID: ["auction", "price"]},
    "q3": {PERSON: ["id", "name", "city", "state"], AUCTION: ["id", "seller", "category"]},
    "q4": {AUCTION: ["id", "seller", "category", "date_time", "expires"],
           BID: ["auction", "price", "date_time"]},
    "q5": {BID: ["auction", "date_time"]},
    "q7": {BID: ["price", "date_time"]},
    "q8": {PERSON: ["id", "name", "date_time"], AUCTION: ["seller", "date_time"]},
    "q9": {AUCTION: ["id", "seller", "category", "date_time", "expires"],
           BID: ["auction", "price", "date_time"]},
    "q11": {BID: ["bidder", "date_time"]},
    "q18": {BID: ["bidder", "auction"]},
    "q19": {BID: ["auction", "price", "date_time"]},
    "q20": {AUCTION: ["id", "item_name", "description", "initial_bid", "reserve", "expires",
                      "seller", "category"],
            BID: ["auction", "bidder", "price", "channel", "url", "date_time"]},
}
"""The kinds and columns each query's answer reads (None: every column), so that the
check of a long run holds only those in memory: at 50 M events every column of every
kind took more than the machine had."""


def read_events(data: Path, query: str | None = None) -> dict[str, pa.Table]:
    """The events under ``data``: every kind and column, or only what ``query``'s answer
    reads (``USED_COLUMNS``)."""
    if query is None:
        return {kind: pq.read_table(parquet_dir(data, kind)) for kind in KINDS}
    return {kind: pq.read_table(parquet_dir(data, kind), columns=columns)
            for kind, columns in USED_COLUMNS[query].items()}


def sort_all(table: pa.Table) -> pa.Table:
    """Rows ordered by every column: two equal multisets of rows become equal tables."""
    return table.sort_by([(name, "ascending") for name in table.column_names])


def _q0(bids: pa.Table, spec: NexmarkSpec) -> pa.Table:
    return bids.set_column(bids.schema.get_field_index("date_time"), "date_time",
                           epoch_ms(bids["date_time"]))


def _q1(bids: pa.Table, spec: NexmarkSpec) -> pa.Table:
    # 0.908 * price, exactly: price * 908 thousandths of a euro
    return pa.table({"auction": bids["auction"], "bidder": bids["bidder"],
                     "price_milli": pc.multiply(bids["price"], 908),
                     "date_time": epoch_ms(bids["date_time"]), "extra": bids["extra"]})


def _q2(bids: pa.Table, spec: NexmarkSpec) -> pa.Table:
    chosen = bids.filter(pa.array(bids["auction"].to_numpy() % spec.q2_modulo == 0))
    return chosen.select(["auction", "price"])


def _q5(bids: pa.Table, spec: NexmarkSpec) -> pa.Table:
    """Per sliding window, the auctions with the most bids (all of them on a tie)."""
    ts = epoch_ms(bids["date_time"]).to_numpy()
    auctions = bids["auction"].to_numpy()
    last_start = ts // spec.slide_ms * spec.slide_ms
    starts, keys = [], []
    for k in range(spec.window_ms // spec.slide_ms):  # each row is in size/slide windows
        start = last_start - k * spec.slide_ms
        inside = ts < start + spec.window_ms
        starts.append(start[inside])
        keys.append(auctions[inside])
    table = pa.table({"auction": np.concatenate(keys), "window_start": np.concatenate(starts)})
    counts = table.group_by(["auction", "window_start"]).aggregate([([], "count_all")])
    counts = counts.rename_columns(["auction", "window_start", "num"])
    best = counts.group_by("window_start").aggregate([("num", "max")])
    hot = counts.join(best, "window_start")
    hot = hot.filter(pc.equal(hot["num"], hot["num_max"]))
    return hot.select(["auction", "num", "window_start"])


def _q7(bids: pa.Table, spec: NexmarkSpec) -> pa.Table:
    """Per tumbling window, the highest price bid."""
    ts = epoch_ms(bids["date_time"]).to_numpy()
    table = pa.table({"window_start": ts // spec.window_ms * spec.window_ms,
                      "price": bids["price"]})
    best = table.group_by("window_start").aggregate([("price", "max")])
    return best.rename_columns(["window_start", "maxprice"])


def _q8(persons: pa.Table, auctions: pa.Table, spec: NexmarkSpec) -> pa.Table:
    """Persons who opened an auction in the tumbling window they joined in."""
    def windowed(table: pa.Table, key: str) -> pa.Table:
        start = epoch_ms(table["date_time"]).to_numpy() // spec.window_ms * spec.window_ms
        return pa.table({"id": table[key], "window_start": start})

    people = windowed(persons, "id").append_column("name", persons["name"])
    sellers = windowed(auctions, "seller").group_by(["id", "window_start"]).aggregate([])
    joined = people.group_by(["id", "name", "window_start"]).aggregate([]).join(
        sellers, ["id", "window_start"], join_type="inner")
    return joined.select(["id", "name", "window_start"])


def _q3(persons: pa.Table, auctions: pa.Table, spec: NexmarkSpec) -> pa.Table:
    """Sellers in the chosen states with their auctions of the chosen category."""
    people = persons.filter(pc.is_in(persons["state"], pa.array(list(spec.q3_states))))
    items = auctions.filter(pc.equal(auctions["category"], spec.category))
    joined = items.select(["id", "seller"]).join(
        people.select(["id", "name", "city", "state"]), "seller", right_keys="id",
        join_type="inner")
    return joined.select(["name", "city", "state", "id"])


def _q9(auctions: pa.Table, bids: pa.Table, spec: NexmarkSpec) -> pa.Table:
    """Each auction's winning bid: the highest of the bids made between its start and its
    expiry (both included), the earliest of equal ones; auctions without one left out."""
    items = pa.table({"id": auctions["id"], "seller": auctions["seller"],
                      "category": auctions["category"],
                      "start": epoch_ms(auctions["date_time"]),
                      "expires": epoch_ms(auctions["expires"])})
    offers = pa.table({"id": bids["auction"], "price": bids["price"],
                       "bid_date_time": epoch_ms(bids["date_time"])})
    both = items.join(offers, "id", join_type="inner")
    ts = both["bid_date_time"]
    both = both.filter(pc.and_(pc.greater_equal(ts, both["start"]),
                               pc.less_equal(ts, both["expires"])))
    ranked = both.sort_by([("id", "ascending"), ("price", "descending"),
                           ("bid_date_time", "ascending")])
    ids = ranked["id"].to_numpy()
    first = np.ones(len(ids), bool)
    first[1:] = ids[1:] != ids[:-1]
    return ranked.filter(pa.array(first)).select(CANONICAL["q9"].names)


def _q4(auctions: pa.Table, bids: pa.Table, spec: NexmarkSpec) -> pa.Table:
    """Per category, the average of its auctions' winning prices (q9's winners)."""
    winners = _q9(auctions, bids, spec)
    sums = winners.group_by("category").aggregate([("price", "sum"), ("price", "count")])
    total, count = sums["price_sum"].to_numpy(), sums["price_count"].to_numpy()
    return pa.table({"category": sums["category"], "auctions": count,
                     "avg_price": total / count})


def _q18(bids: pa.Table, spec: NexmarkSpec) -> pa.Table:
    """Each bidder's first bid on each auction, as the pair."""
    return bids.select(["bidder", "auction"]).group_by(["bidder", "auction"]).aggregate([])


def _q19(bids: pa.Table, spec: NexmarkSpec) -> pa.Table:
    """Per auction and tumbling window, the ``top_n`` highest bids, ranked from 1."""
    start = epoch_ms(bids["date_time"]).to_numpy() // spec.window_ms * spec.window_ms
    table = pa.table({"auction": bids["auction"], "window_start": start,
                      "price": bids["price"]}).sort_by(
        [("auction", "ascending"), ("window_start", "ascending"), ("price", "descending")])
    auction, window = table["auction"].to_numpy(), table["window_start"].to_numpy()
    n = len(auction)
    new = np.ones(n, bool)
    new[1:] = (auction[1:] != auction[:-1]) | (window[1:] != window[:-1])
    rank = np.arange(n) - np.maximum.accumulate(np.where(new, np.arange(n), 0)) + 1
    keep = rank <= spec.top_n
    return table.filter(pa.array(keep)).append_column("rank", pa.array(rank[keep]))


def _q20(auctions: pa.Table, bids: pa.Table, spec: NexmarkSpec) -> pa.Table:
    """Bids with their auction's details, for auctions of the chosen category."""
    items = auctions.filter(pc.equal(auctions["category"], spec.category)).select(
        ["id", "item_name", "description", "initial_bid", "reserve", "expires", "seller",
         "category"])
    offers = bids.select(["auction", "bidder", "price", "channel", "url", "date_time"])
    joined = offers.join(items, "auction", right_keys="id", join_type="inner")
    return joined.set_column(joined.schema.get_field_index("date_time"), "date_time",
                             epoch_ms(joined["date_time"])).set_column(
        joined.schema.get_field_index("expires"), "expires", epoch_ms(joined["expires"]))


def _q11(bids: pa.Table, spec: NexmarkSpec) -> pa.Table:
    """Per bidder, its sessions: bids each less than the gap after the previous one."""
    table = pa.table({"bidder": bids["bidder"], "ts": epoch_ms(bids["date_time"])})
    table = table.sort_by([("bidder", "ascending"), ("ts", "ascending")])
    bidder, ts = table["bidder"].to_numpy(), table["ts"].to_numpy()
    if not len(ts):
        return CANONICAL["q11"].empty_table()
    new = np.ones(len(ts), bool)
    new[1:] = (bidder[1:] != bidder[:-1]) | (ts[1:] - ts[:-1] >= spec.session_gap_ms)
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(ts)) - 1
    return pa.table({"bidder": bidder[first], "bid_count": (last - first + 1).astype(np.int64),
                     "window_start": ts[first],
                     "window_end": ts[last] + spec.session_gap_ms})


def answer(query: str, events: Mapping[str, pa.Table], spec: NexmarkSpec) -> pa.Table:
    """The query's canonical answer over ``events`` (kind -> table), sorted."""
    if query not in QUERIES:
        raise ValueError(f"unknown query {query!r}; one of {', '.join(QUERIES)}")
    two = {"q3": _q3, "q4": _q4, "q8": _q8, "q9": _q9, "q20": _q20}
    if query in two:
        result = two[query](*(events[kind] for kind in inputs_of(query)), spec)
    else:
        result = {"q0": _q0, "q1": _q1, "q2": _q2, "q5": _q5, "q7": _q7, "q11": _q11,
                  "q18": _q18, "q19": _q19}[query](events[BID], spec)
    return sort_all(result.select(CANONICAL[query].names).cast(CANONICAL[query]))


def window_end(query: str, table: pa.Table, spec: NexmarkSpec) -> np.ndarray:
    """Each answer row's window end (epoch ms); the queries without a window (q0-q3,
    q9, q18, q20) send their rows out whatever the watermark (the lowest int64)."""
    if query == "q11":
        return table["window_end"].to_numpy()
    if query in ("q5", "q7", "q8", "q19"):
        return table["window_start"].to_numpy() + spec.window_ms
    return np.full(table.num_rows, np.iinfo(np.int64).min)


def closed(query: str, table: pa.Table, spec: NexmarkSpec, watermark_ms: int) -> pa.Table:
    """The answer rows whose window ends at or before ``watermark_ms``: what a system
    whose watermark stops there (Spark's, at the input's end) can have output."""
    keep = window_end(query, table, spec) <= watermark_ms
    return table.filter(pa.array(keep))


def final_watermark(query: str, events: Mapping[str, pa.Table], spec: NexmarkSpec) -> int:
    """The highest event time read minus the delay; over several inputs, the lowest
    (Spark's default multiple-watermark policy)."""
    highest = [pc.max(epoch_ms(events[k]["date_time"])).as_py() for k in inputs_of(query)]
    return min(h for h in highest if h is not None) - spec.watermark_delay_ms
