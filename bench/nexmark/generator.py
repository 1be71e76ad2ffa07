"""A seeded Nexmark generator, written from the Nexmark specification, and its files.

What follows the spec (nexmark/nexmark's generator): the 1:3:46 proportions by event
id, ids from 1000 (persons, auctions) and categories from 10 (five of them), a person id
being the count of persons so far, an auction id the count of auctions so far, sellers
and bidders mostly "hot" (3 in 4: the first or second person of the last hundred) or
else one of the 1,000 most recent persons (plus 10 ids ahead), bids for a hot auction
(1 in 2: the first of the last hundred) or one of the 100 auctions in flight (plus 10
ahead), prices ``round(10 ** (6u) * 100)`` cents, reserve = initial bid + a price,
auctions expiring within twice the time 100 auctions take, names, cities and states from
its lists, and ``extra`` padding each event to its average size (person 200, auction 500,
bid 100 bytes). What differs: numpy's seeded generator per file instead of Java's
``Random`` per event (the values differ; their laws do not), random strings of lowercase
letters, and the bids' ``channel`` and ``url`` kept simple. Out of order: a fraction of
events stamped up to ``max_disorder_ms`` early (``model.NexmarkSpec``).

Why files: every system reads the same rows, written before any clock starts: Parquet
(uncompressed, no dictionary, one file per kind and ``events_per_file`` events) for
Weir's ``ParquetSource`` and Spark's file source, and one CSV file per kind for Flink,
whose offline built-in formats are CSV and JSON (one file, so its single reader reads
it in event order).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from bench.nexmark.model import AUCTION, BID, KINDS, PERSON, SCHEMAS, NexmarkSpec

__all__ = ["FIRST_AUCTION_ID", "FIRST_PERSON_ID", "chunk", "events", "parquet_dir",
           "csv_path", "write_files"]

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
_PROPORTIONS = (1, 3, 46)  # person, auction, bid
_TOTAL = sum(_PROPORTIONS)
_CATEGORIES = 5
_ACTIVE_PEOPLE = 1_000
_IN_FLIGHT_AUCTIONS = 100
_ID_LEAD = 10
_HOT_RATIO = 100  # hot sellers, bidders, auctions: one of each hundred
_HOT_AUCTION_RATIO, _HOT_SELLER_RATIO, _HOT_BIDDER_RATIO = 2, 4, 4
_AVG_BYTES = {PERSON: 200, AUCTION: 500, BID: 100}
_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend",
           "Redmond", "Seattle", "Kent", "Cheyenne")
_FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
                "Deiter", "Walter")
_LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
               "Noris")
_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")


def last_person(ids: np.ndarray) -> np.ndarray:
    """The newest person id (base 0) at each event id: the spec's ``lastBase0PersonId``."""
    epoch, offset = ids // _TOTAL, ids % _TOTAL
    return epoch * _PROPORTIONS[0] + np.minimum(offset, _PROPORTIONS[0] - 1)


def last_auction(ids: np.ndarray) -> np.ndarray:
    """The newest auction id (base 0) at each event id: ``lastBase0AuctionId``."""
    epoch, offset = ids // _TOTAL, ids % _TOTAL
    persons, auctions = _PROPORTIONS[0], _PROPORTIONS[1]
    before = offset < persons  # about to make a person: the previous epoch's last auction
    epoch = np.where(before, epoch - 1, epoch)
    offset = np.where(before | (offset >= persons + auctions), auctions - 1, offset - persons)
    return epoch * auctions + offset


def _random_person(rng: np.random.Generator, ids: np.ndarray) -> np.ndarray:
    """One of the active persons or a few ahead (base 0): ``nextBase0PersonId``."""
    people = last_person(ids) + 1
    active = np.minimum(people, _ACTIVE_PEOPLE)
    return people - active + rng.integers(0, active + _ID_LEAD)


def _random_auction(rng: np.random.Generator, ids: np.ndarray) -> np.ndarray:
    """One of the auctions in flight or a few ahead (base 0): ``nextBase0AuctionId``."""
    newest = last_auction(ids)
    oldest = np.maximum(newest - _IN_FLIGHT_AUCTIONS, 0)
    return oldest + rng.integers(0, newest - oldest + 1 + _ID_LEAD)


def _prices(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.round(10.0 ** (rng.random(n) * 6.0) * 100.0).astype(np.int64)


def _strings(rng: np.random.Generator, lengths: np.ndarray) -> pa.Array:
    """Random lowercase strings of the given lengths, built straight into Arrow buffers."""
    lengths = lengths.astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = (rng.integers(0, 26, int(offsets[-1]), dtype=np.uint8) + ord("a")).tobytes()
    return pa.StringArray.from_buffers(len(lengths), pa.py_buffer(offsets.tobytes()),
                                       pa.py_buffer(data))


def _short_strings(rng: np.random.Generator, n: int, longest: int) -> pa.Array:
    """The spec's ``nextString``: 3 to ``longest - 1`` characters."""
    return _strings(rng, rng.integers(3, longest, n))


def _extra(rng: np.random.Generator, n: int, kind: str, used: int) -> pa.Array:
    """Padding to the kind's average size: ``nextExtra``, lengths within 20 % of the gap."""
    want = max(_AVG_BYTES[kind] - used, 0)
    delta = round(want * 0.2)
    return _strings(rng, rng.integers(want - delta, want + delta + 1, n))


def _pick(rng: np.random.Generator, n: int, words: tuple[str, ...]) -> pa.Array:
    return pa.array(words).take(pa.array(rng.integers(0, len(words), n)))


def _timestamps(spec: NexmarkSpec, rng: np.random.Generator, ids: np.ndarray) -> np.ndarray:
    """Each event's time (epoch ms): due by its id, a fraction stamped up to the disorder
    bound early."""
    due = spec.start_ms + ids * 1000 // spec.events_per_second
    early = rng.integers(1, spec.max_disorder_ms + 1, len(ids))
    return due - np.where(rng.random(len(ids)) < spec.out_of_order, early, 0)


def _ts(values: np.ndarray) -> pa.Array:
    return pa.array(values.astype(np.int64), pa.timestamp("ms", tz="UTC"))


def _persons(spec: NexmarkSpec, rng: np.random.Generator, ids: np.ndarray,
             ts: np.ndarray) -> pa.Table:
    n = len(ids)
    first, last = _pick(rng, n, _FIRST_NAMES), _pick(rng, n, _LAST_NAMES)
    import pyarrow.compute as pc

    name = pc.binary_join_element_wise(first, last, " ")
    email = pc.binary_join_element_wise(_short_strings(rng, n, 7), _short_strings(rng, n, 5),
                                        "@")
    email = pc.binary_join_element_wise(email, pa.scalar(".com"), "")
    digits = rng.integers(0, 10_000, (n, 4))
    card = pa.array([f"{a:04d} {b:04d} {c:04d} {d:04d}" for a, b, c, d in digits.tolist()])
    return pa.table([pa.array(last_person(ids) + FIRST_PERSON_ID), name, email, card,
                     _pick(rng, n, _CITIES), _pick(rng, n, _STATES), _ts(ts),
                     _extra(rng, n, PERSON, 64)], schema=SCHEMAS[PERSON])


def _auctions(spec: NexmarkSpec, rng: np.random.Generator, ids: np.ndarray,
              ts: np.ndarray) -> pa.Table:
    n = len(ids)
    hot = rng.integers(0, _HOT_SELLER_RATIO, n) > 0
    seller = np.where(hot, last_person(ids) // _HOT_RATIO * _HOT_RATIO,
                      _random_person(rng, ids)) + FIRST_PERSON_ID
    initial = _prices(rng, n)
    # the auction 100 auctions ahead is due this far ahead; lengths average that horizon
    horizon_ms = _IN_FLIGHT_AUCTIONS * _TOTAL // _PROPORTIONS[1] * 1000 // spec.events_per_second
    expires = ts + 1 + rng.integers(0, max(horizon_ms * 2, 1), n)
    return pa.table([pa.array(last_auction(ids) + FIRST_AUCTION_ID),
                     _short_strings(rng, n, 20), _short_strings(rng, n, 100),
                     pa.array(initial), pa.array(initial + _prices(rng, n)), _ts(ts),
                     _ts(expires), pa.array(seller),
                     pa.array(FIRST_CATEGORY_ID + rng.integers(0, _CATEGORIES, n)),
                     _extra(rng, n, AUCTION, 110)], schema=SCHEMAS[AUCTION])


def _bids(spec: NexmarkSpec, rng: np.random.Generator, ids: np.ndarray,
          ts: np.ndarray) -> pa.Table:
    n = len(ids)
    hot_auction = rng.integers(0, _HOT_AUCTION_RATIO, n) > 0
    auction = np.where(hot_auction, last_auction(ids) // _HOT_RATIO * _HOT_RATIO,
                       _random_auction(rng, ids)) + FIRST_AUCTION_ID
    hot_bidder = rng.integers(0, _HOT_BIDDER_RATIO, n) > 0
    bidder = np.where(hot_bidder, last_person(ids) // _HOT_RATIO * _HOT_RATIO + 1,
                      _random_person(rng, ids)) + FIRST_PERSON_ID
    hot_channel = rng.integers(0, 10, n) > 0
    channel = np.where(hot_channel, np.array(_CHANNELS, dtype=object)[rng.integers(0, 4, n)],
                       np.char.add("channel-", rng.integers(0, 10_000, n).astype(str))
                       .astype(object))
    url = np.char.add("https://www.nexmark.com/item.htm?query=1&channel_id=",
                      rng.integers(0, 10_000, n).astype(str))
    return pa.table([pa.array(auction), pa.array(bidder), pa.array(_prices(rng, n)),
                     pa.array(channel, pa.string()), pa.array(url, pa.string()), _ts(ts),
                     _extra(rng, n, BID, 32)], schema=SCHEMAS[BID])


def chunk(spec: NexmarkSpec, index: int) -> dict[str, pa.Table]:
    """File ``index``'s events per kind: event ids ``[index, index + 1) * events_per_file``.

    Seeded by (seed, index), so a file is the same whatever else is generated.
    """
    first = index * spec.events_per_file
    ids = np.arange(first, min(first + spec.events_per_file, spec.events), dtype=np.int64)
    rng = np.random.default_rng([spec.seed, index])
    ts = _timestamps(spec, rng, ids)
    offset = ids % _TOTAL
    kinds = {PERSON: offset < _PROPORTIONS[0],
             AUCTION: (offset >= _PROPORTIONS[0]) & (offset < _PROPORTIONS[0] + _PROPORTIONS[1]),
             BID: offset >= _PROPORTIONS[0] + _PROPORTIONS[1]}
    makers = {PERSON: _persons, AUCTION: _auctions, BID: _bids}
    return {kind: makers[kind](spec, rng, ids[mask], ts[mask]) for kind, mask in kinds.items()}


def events(spec: NexmarkSpec) -> Iterator[dict[str, pa.Table]]:
    """Every file's events, in order."""
    for index in range(spec.files):
        yield chunk(spec, index)


def parquet_dir(data: Path, kind: str) -> Path:
    """Where the kind's Parquet files are (Weir and Spark read these)."""
    return data / "parquet" / kind


def csv_path(data: Path, kind: str) -> Path:
    """The kind's one CSV file (Flink reads it)."""
    return data / "csv" / kind / f"{kind}.csv"


def _csv_ready(table: pa.Table) -> pa.Table:
    """Timestamps as ``yyyy-MM-dd HH:mm:ss.SSS`` (UTC wall clock), Flink's TIMESTAMP(3)."""
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if pa.types.is_timestamp(field.type):
            column = column.cast(pa.timestamp("ms")).cast(pa.string())
        columns.append(column)
    return pa.table(columns, names=table.column_names)


def write_files(spec: NexmarkSpec, data: Path, csv: bool = True) -> dict[str, int]:
    """Writes the events under ``data`` (Parquet per kind and file; with ``csv``, one CSV
    per kind too); returns the rows per kind."""
    rows = dict.fromkeys(KINDS, 0)
    writers: dict[str, pacsv.CSVWriter] = {}
    try:
        for index, tables in enumerate(events(spec)):
            for kind, table in tables.items():
                folder = parquet_dir(data, kind)
                folder.mkdir(parents=True, exist_ok=True)
                pq.write_table(table, folder / f"part-{index:06d}.parquet",
                               compression="none", use_dictionary=False)
                rows[kind] += table.num_rows
                if csv:
                    ready = _csv_ready(table)
                    if kind not in writers:
                        path = csv_path(data, kind)
                        path.parent.mkdir(parents=True, exist_ok=True)
                        writers[kind] = pacsv.CSVWriter(
                            str(path), ready.schema,
                            write_options=pacsv.WriteOptions(include_header=False,
                                                             quoting_style="none"))
                    writers[kind].write_table(ready)
    finally:
        for writer in writers.values():
            writer.close()
    return rows
