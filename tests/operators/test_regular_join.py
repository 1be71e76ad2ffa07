"""RegularJoin through the local runner: every pair of rows with equal keys once, however
far apart they came, until the TTL forgets a quiet key; the TTL is required."""

from __future__ import annotations

import collections

import pytest

from tests.operators.test_interval_join import as_id
from tests.operators.test_window_join import join_dag, streams
from weir.operators.library import RegularJoin
from weir.operators.testing import run_local


def test_every_pair_with_equal_keys_meets_once():
    persons, auctions = streams(seed=8, windows=10)
    run = run_local(join_dag(RegularJoin("id", ttl_millis=3_600_000), persons,
                             as_id(auctions)))
    got = collections.Counter((r["id"], r["name"], r["ts"], r["item"], r["right_ts"])
                              for r in run.rows("out"))
    expected = collections.Counter(
        (p["id"], p["name"], p["ts"], a["item"], a["ts"])
        for p in (p for w in persons for p in w) for a in (a for w in auctions for a in w)
        if p["id"] == a["seller"])
    assert sum(expected.values()) > 20 and got == expected


def test_a_key_quiet_for_longer_than_the_ttl_is_forgotten():
    persons = [[{"id": 1, "name": "ann", "ts": 0}]] + [[]] * 6
    auctions = [[]] * 6 + [[{"seller": 1, "item": "x", "ts": 0, "name": "a"}]]
    for ttl, pairs in ((1_000, 0), (60_000, 1)):
        run = run_local(join_dag(RegularJoin("id", ttl_millis=ttl), persons,
                                 as_id(auctions)))
        assert len(run.rows("out")) == pairs, ttl


def test_the_ttl_is_required():
    with pytest.raises(ValueError, match="ttl_millis is required"):
        RegularJoin("id", ttl_millis=0)
