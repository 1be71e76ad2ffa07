"""The Nexmark generator: seeded, in the spec's proportions and id rules, out of order
only within its bound, and written once as the files every system reads."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from bench.nexmark.generator import chunk, csv_path, parquet_dir, write_files
from bench.nexmark.model import AUCTION, BID, PERSON, SCHEMAS, NexmarkSpec

SMALL = NexmarkSpec(events=50_000, events_per_file=10_000, events_per_second=10_000)


def _all(spec: NexmarkSpec) -> dict[str, pa.Table]:
    parts = [chunk(spec, i) for i in range(spec.files)]
    return {kind: pa.concat_tables(p[kind] for p in parts) for kind in (PERSON, AUCTION, BID)}


def _ms(table: pa.Table) -> np.ndarray:
    return table["date_time"].cast(pa.int64()).to_numpy()


def test_the_same_seed_gives_the_same_events_and_another_seed_others() -> None:
    first, again = chunk(SMALL, 3), chunk(SMALL, 3)
    other = chunk(NexmarkSpec(events=50_000, events_per_file=10_000, seed=7), 3)
    for kind in (PERSON, AUCTION, BID):
        assert first[kind].equals(again[kind])
        assert first[kind].schema == SCHEMAS[kind]
    assert not first[BID].equals(other[BID])


def test_persons_auctions_and_bids_come_one_to_three_to_forty_six() -> None:
    tables = _all(SMALL)
    assert {k: t.num_rows for k, t in tables.items()} == {PERSON: 1_000, AUCTION: 3_000,
                                                          BID: 46_000}


def test_ids_categories_and_prices_follow_the_spec() -> None:
    tables = _all(SMALL)
    persons, auctions, bids = tables[PERSON], tables[AUCTION], tables[BID]
    assert persons["id"].to_pylist() == list(range(1000, 2000))  # one after another
    assert auctions["id"].to_pylist() == list(range(1000, 4000))
    assert set(auctions["category"].to_pylist()) == {10, 11, 12, 13, 14}
    # a seller or bidder is a person that exists, or one of the 10 ids just ahead
    assert auctions["seller"].to_numpy().max() <= persons["id"].to_numpy().max() + 10
    assert bids["bidder"].to_numpy().min() >= 1000
    assert bids["auction"].to_numpy().max() <= auctions["id"].to_numpy().max() + 10
    prices = bids["price"].to_numpy()
    assert prices.min() >= 100 and prices.max() <= 100_000_000
    reserve, initial = auctions["reserve"].to_numpy(), auctions["initial_bid"].to_numpy()
    assert np.all(reserve > initial)
    assert np.all(_ms(auctions) < auctions["expires"].cast(pa.int64()).to_numpy())
    # hot auctions and bidders: about half the bids go to the first of the last hundred
    # auctions, three in four come from the second of the last hundred persons
    assert 0.4 < np.mean(bids["auction"].to_numpy() % 100 == 0) < 0.6
    assert 0.7 < np.mean(bids["bidder"].to_numpy() % 100 == 1) < 0.8
    sizes = pa.compute.binary_length(bids["extra"]).to_numpy()
    assert 50 < sizes.mean() < 90  # a bid pads to about 100 bytes


def test_events_are_out_of_order_only_within_the_bound() -> None:
    tables = _all(SMALL)
    # a person's event id is 50 x its base-0 id: its due time is known
    ids = tables[PERSON]["id"].to_numpy() - 1000
    due = SMALL.start_ms + ids * 50 * 1000 // SMALL.events_per_second
    early = due - _ms(tables[PERSON])
    assert early.min() == 0 and early.max() <= SMALL.max_disorder_ms
    assert 0.02 < np.mean(early > 0) < 0.08
    # in file order, no event is further than the bound behind one before it: with a
    # watermark delay of the bound, no row is ever late, whatever the batches
    for kind in (PERSON, AUCTION, BID):
        ts = _ms(tables[kind])
        highest_before = np.maximum.accumulate(np.concatenate([[ts[0]], ts[:-1]]))
        assert np.all(ts >= highest_before - SMALL.max_disorder_ms), kind
    bids = _ms(tables[BID])
    assert np.any(bids[1:] < bids[:-1])  # and some are out of order


def test_the_files_hold_the_same_rows_as_parquet_and_as_csv(tmp_path: Path) -> None:
    rows = write_files(SMALL, tmp_path)
    assert rows == {PERSON: 1_000, AUCTION: 3_000, BID: 46_000}
    tables = _all(SMALL)
    for kind in (PERSON, AUCTION, BID):
        files = sorted(parquet_dir(tmp_path, kind).glob("*.parquet"))
        assert len(files) == SMALL.files  # file k of every kind: the same event ids
        assert pq.read_table(parquet_dir(tmp_path, kind)).equals(tables[kind])
        csv = pacsv.read_csv(csv_path(tmp_path, kind), read_options=pacsv.ReadOptions(
            column_names=SCHEMAS[kind].names))
        assert csv.num_rows == tables[kind].num_rows
        assert csv["date_time"][0].as_py().strftime("%Y-%m-%d %H:%M:%S") == \
            tables[kind]["date_time"][0].as_py().strftime("%Y-%m-%d %H:%M:%S")
    line = csv_path(tmp_path, BID).read_text().splitlines()[0].split(",")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", line[5])  # TIMESTAMP(3)
    assert len(line) == 7  # no value needed quoting
