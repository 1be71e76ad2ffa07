"""Deduplicate through the local runner: each key's first row within the horizon goes
out once, repeats go to ``duplicates``, the key is forgotten once the watermark passes the
horizon, and a recovered run keeps exactly the same rows."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from weir.operators import Dag
from weir.operators.library import Deduplicate
from weir.operators.testing import CollectSink, ListSource, run_local

BIDS = pa.schema([("bid", pa.int64()), ("ts", pa.int64()), ("price", pa.int64())])


def dedup_dag(windows, within_ms: int, **attributes) -> Dag:
    dag = Dag("dedup", **attributes)
    src = dag.add_operator("bids", ListSource(windows, BIDS), EVENT_TIME_COLUMN="ts",
                           WATERMARK_DELAY_MILLIS=100)
    node = dag.add_operator("dedup", Deduplicate("bid", "ts", within_ms))
    out = dag.add_operator("out", CollectSink())
    dups = dag.add_operator("dups", CollectSink())
    dag.add_stream("bids", src.output, node.input)
    dag.add_stream("firsts", node.output, out.input)
    dag.add_stream("repeats", node.duplicates, dups.input)
    return dag


def bids(seed: int, windows: int = 20):
    """Bids re-sent up to 3 times, each repeat up to 800 ms after the first."""
    rng = random.Random(seed)
    out, pending = [], []
    for w in range(windows):
        rows = [{"bid": w * 100 + i, "ts": w * 1_000 + rng.randrange(1_000),
                 "price": rng.randrange(50)} for i in range(rng.randrange(5))]
        pending += [dict(r, ts=r["ts"] + rng.randrange(800)) for r in rows
                    for _ in range(rng.randrange(3))]
        due = [r for r in pending if r["ts"] < (w + 1) * 1_000]
        pending = [r for r in pending if r not in due]
        out.append(rows + due)
    out.append(pending)
    return out


def reference(windows, within_ms):
    """First row per bid in arrival order, a key forgotten within_ms after its first."""
    first: dict[int, int] = {}
    kept, repeats = [], []
    for rows in windows:
        for row in rows:
            seen = first.get(row["bid"])
            if seen is None:
                first[row["bid"]] = row["ts"]
                kept.append(row)
            else:
                repeats.append(row)
    return kept, repeats


def test_each_key_goes_out_once_within_the_horizon_and_repeats_to_duplicates():
    windows = bids(seed=5)
    run = run_local(dedup_dag(windows, within_ms=10_000))
    kept, repeats = reference(windows, 10_000)
    assert len(repeats) > 5
    assert sorted(run.rows("out"), key=str) == sorted(kept, key=str)
    assert sorted(run.rows("dups"), key=str) == sorted(repeats, key=str)


def test_a_key_is_forgotten_once_the_watermark_passes_its_horizon():
    windows = [[{"bid": 1, "ts": 0, "price": 1}], [{"bid": 1, "ts": 500, "price": 2}],
               [{"bid": 2, "ts": 3_000, "price": 0}], [{"bid": 1, "ts": 3_100, "price": 3}]]
    run = run_local(dedup_dag(windows, within_ms=1_000))
    assert [(r["bid"], r["price"]) for r in run.rows("out")] == [(1, 1), (2, 0), (1, 3)]
    assert [(r["bid"], r["price"]) for r in run.rows("dups")] == [(1, 2)]


def test_a_recovered_run_keeps_the_same_rows(tmp_path):
    windows = bids(seed=9, windows=24)
    whole = run_local(dedup_dag(windows, 5_000))
    make = lambda: dedup_dag(windows, 5_000, CHECKPOINT_WINDOW_COUNT=3)  # noqa: E731
    first = run_local(make(), stop_after_window=13, checkpoint_dir=str(tmp_path))
    resumed = run_local(make(), checkpoint_dir=str(tmp_path))
    before = [r for w, rows in sorted(first.windows("out").items()) for r in rows
              if w <= resumed.resumed_from]
    assert before + resumed.rows("out") == whole.rows("out")


def test_keys_past_their_horizon_are_swept_out_of_the_store(monkeypatch):
    """The store holds about one and a half horizons of keys, not every key ever seen:
    a lookup already counts a key past its horizon as absent, and the sweep deletes it."""
    windows = [[{"bid": w * 10 + i, "ts": w * 1_000 + i, "price": 0} for i in range(10)]
               for w in range(30)]
    held: list[int] = []  # the store's keys before each window's write
    sweep = Deduplicate._sweep

    def watched(self, changes):
        held.append(self.store.keys)
        sweep(self, changes)

    monkeypatch.setattr(Deduplicate, "_sweep", watched)
    run = run_local(dedup_dag(windows, within_ms=2_000))
    assert len(run.rows("out")) == 300 and run.rows("dups") == []
    assert max(held) <= 40  # 300 keys seen; about 3 s of them (10 a second) kept
    assert run.operator("dedup").keys_forgotten >= 250


def test_bad_settings_are_refused_when_built():
    with pytest.raises(ValueError, match="within_ms"):
        Deduplicate("bid", "ts", 0)


def test_keys_of_several_columns_and_rows_without_event_time():
    schema = pa.schema([("bidder", pa.int64()), ("auction", pa.string()),
                        ("ts", pa.timestamp("ms", tz="UTC"))])
    windows = [pa.Table.from_pylist(rows, schema) for rows in (
        [{"bidder": 1, "auction": "a", "ts": 10}, {"bidder": 1, "auction": "b", "ts": 11},
         {"bidder": 1, "auction": "a", "ts": 12}, {"bidder": 2, "auction": "a", "ts": None},
         {"bidder": 2, "auction": "a", "ts": 13}],
        [{"bidder": 2, "auction": "a", "ts": 14}, {"bidder": 1, "auction": "b", "ts": 15},
         {"bidder": 3, "auction": "c", "ts": None}])]
    dag = Dag("dedup")
    src = dag.add_operator("bids", ListSource(windows, schema), EVENT_TIME_COLUMN="ts",
                           WATERMARK_DELAY_MILLIS=100)
    node = dag.add_operator("dedup", Deduplicate(("bidder", "auction"), "ts", 60_000))
    out, dups = dag.add_operator("out", CollectSink()), dag.add_operator("dups", CollectSink())
    dag.add_stream("bids", src.output, node.input)
    dag.add_stream("firsts", node.output, out.input)
    dag.add_stream("repeats", node.duplicates, dups.input)
    run = run_local(dag)

    def pairs(name):
        return [(r["bidder"], r["auction"], r["ts"] and r["ts"].timestamp() * 1000)
                for r in run.rows(name)]

    assert pairs("out") == [(1, "a", 10), (1, "b", 11), (2, "a", None), (2, "a", 13),
                            (3, "c", None)]
    assert sorted(pairs("dups")) == [(1, "a", 12), (1, "b", 15), (2, "a", 14)]
