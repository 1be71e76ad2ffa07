"""Nexmark q9's ``WinningBids`` (a ``KeyedProcess`` as a user writes it) through the
local runner on generated events, split into streaming windows in file order: its
winners equal the reference's exactly, bids before their auction included; and q4's
``CategoryAverage`` over them, whose last row per category is the reference's average."""

from __future__ import annotations

import pyarrow as pa

from bench.nexmark import compare
from bench.nexmark.category_average import CategoryAverage
from bench.nexmark.generator import chunk
from bench.nexmark.model import AUCTION, BID, NexmarkSpec
from bench.nexmark.reference import answer
from bench.nexmark.winning_bids import WinningBids
from weir.operators import Dag
from weir.operators.testing import CollectSink, ListSource, run_local


def test_winning_bids_and_their_category_averages_equal_the_reference():
    spec = NexmarkSpec(events=30_000, events_per_file=10_000, events_per_second=2_000)
    files = [chunk(spec, i) for i in range(spec.files)]
    events = {kind: pa.concat_tables(f[kind] for f in files) for kind in files[0]}
    dag = Dag("q9")
    sources = {}
    for kind, columns in ((AUCTION, ["id", "seller", "category", "date_time", "expires"]),
                          (BID, ["auction", "bidder", "price", "date_time"])):
        table = events[kind].select(columns)
        step = -(-table.num_rows // 12)
        windows = [table.slice(i, step) for i in range(0, table.num_rows, step)]
        sources[kind] = dag.add_operator(kind, ListSource(windows, table.schema),
                                         EVENT_TIME_COLUMN="date_time",
                                         WATERMARK_DELAY_MILLIS=spec.watermark_delay_ms)
    node = dag.add_operator("q9", WinningBids())
    average = dag.add_operator("q4", CategoryAverage())
    out = dag.add_operator("out", CollectSink())
    averages = dag.add_operator("averages", CollectSink())
    dag.add_stream("a", sources[AUCTION].output, node.auctions)
    dag.add_stream("b", sources[BID].output, node.bids)
    dag.add_stream("w", node.output, out.input, average.input)
    dag.add_stream("c", average.output, averages.input)
    run = run_local(dag)
    got = pa.Table.from_pylist(run.rows("out"), WinningBids.OUTPUT)
    expected = answer("q9", events, spec)
    assert expected.num_rows > 100
    assert compare.check(compare.canonical("q9", got), expected) == (
        True, f"{expected.num_rows:,} rows, exact")
    updates = pa.Table.from_pylist(run.rows("averages"), CategoryAverage.OUTPUT)
    final = answer("q4", events, spec)
    assert updates.num_rows > final.num_rows > 1  # the averages were updated on the way
    assert compare.check(compare.canonical("q4", updates), final) == (
        True, f"{final.num_rows:,} rows, exact")
