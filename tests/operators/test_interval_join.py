"""IntervalJoin through the local runner: equal to a plain Python interval join of the
same rows (each pair once, whichever side came second), late rows to ``late``, and the
same pairs after a recovery."""

from __future__ import annotations

import collections

import pyarrow as pa
import pytest

from tests.operators.test_window_join import AUCTIONS, join_dag, streams
from weir.operators.library import IntervalJoin
from weir.operators.testing import run_local

SCHEMA = pa.schema([("id", pa.int64()), *list(AUCTIONS)[1:]])


def as_id(auctions):
    return [pa.Table.from_pylist([{**a, "id": a["seller"]} for a in w], SCHEMA)
            for w in auctions]


def reference(persons, auctions, lower, upper) -> collections.Counter:
    return collections.Counter(
        (p["id"], p["name"], p["ts"], a["item"], a["ts"])
        for p in (p for w in persons for p in w) for a in (a for w in auctions for a in w)
        if p["id"] == a["seller"] and p["ts"] + lower <= a["ts"] <= p["ts"] + upper)


@pytest.mark.parametrize(("lower", "upper"), [(0, 1_500), (-800, 300), (-2_000, -500)])
def test_an_interval_join_equals_a_plain_join_of_the_same_rows(lower, upper):
    persons, auctions = streams(seed=upper & 0xFF, windows=14)
    run = run_local(join_dag(IntervalJoin("id", "ts", lower, upper), persons,
                             as_id(auctions), delay_ms=400))
    assert run.rows("late") == []
    got = collections.Counter((r["id"], r["name"], r["ts"], r["item"], r["right_ts"])
                              for r in run.rows("out"))
    expected = reference(persons, auctions, lower, upper)
    assert sum(expected.values()) > 5
    assert got == expected


def test_rows_older_than_the_watermark_go_to_late_and_recovery_keeps_each_pair_once(
        tmp_path):
    persons, auctions = streams(seed=4, windows=30, disorder_ms=1_500)
    make = lambda **a: join_dag(IntervalJoin("id", "ts", -500, 500), persons,  # noqa: E731
                                as_id(auctions), delay_ms=200, **a)
    whole = run_local(make())
    assert whole.rows("late") and all(
        r["late_reason"].endswith("its partners' time had passed when it came")
        for r in whole.rows("late"))
    late = {(r["id"], r["ts"], r.get("name")) for r in whole.rows("late")}
    on_time = ([[p for p in w if (p["id"], p["ts"], p["name"]) not in late] for w in persons],
               [[a for a in w if (a["seller"], a["ts"], a["name"]) not in late]
                for w in auctions])
    got = collections.Counter((r["id"], r["name"], r["ts"], r["item"], r["right_ts"])
                              for r in whole.rows("out"))
    assert got == reference(*on_time, -500, 500)  # every pair of rows on time meets
    first = run_local(make(CHECKPOINT_WINDOW_COUNT=3), stop_after_window=8,
                      checkpoint_dir=str(tmp_path))
    resumed = run_local(make(CHECKPOINT_WINDOW_COUNT=3), checkpoint_dir=str(tmp_path))
    before = [r for w, rows in sorted(first.windows("out").items()) for r in rows
              if w <= resumed.resumed_from]
    assert sorted(map(str, before + resumed.rows("out"))) == \
        sorted(map(str, whole.rows("out")))


def test_an_empty_interval_is_refused_when_built():
    with pytest.raises(ValueError, match="would be empty"):
        IntervalJoin("id", "ts", lower_ms=10, upper_ms=5)
