"""RegularJoin through the local runner: every pair of rows with equal keys once, however
far apart they came, until the TTL forgets a quiet key; the TTL is required."""

from __future__ import annotations

import collections

import pyarrow as pa
import pytest

from tests.operators.test_interval_join import as_id
from tests.operators.test_window_join import join_dag, streams
from weir.operators import Dag
from weir.operators.library import RegularJoin
from weir.operators.testing import CollectSink, ListSource, run_local


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


def test_a_recovered_join_emits_each_pair_once(tmp_path):
    persons, auctions = streams(seed=4, windows=16)
    make = lambda: join_dag(RegularJoin("id", ttl_millis=3_600_000), persons,  # noqa: E731
                            as_id(auctions), CHECKPOINT_WINDOW_COUNT=3)
    whole = run_local(make())
    first = run_local(make(), stop_after_window=9, checkpoint_dir=str(tmp_path))
    resumed = run_local(make(), checkpoint_dir=str(tmp_path))
    before = [r for w, rows in sorted(first.windows("out").items()) for r in rows
              if w <= resumed.resumed_from]
    assert whole.rows("out")
    assert sorted(map(str, before + resumed.rows("out"))) == sorted(map(str, whole.rows("out")))


def _two_sided(left_windows, right_windows, join, left_schema, right_schema) -> Dag:
    dag = Dag("join")
    left = dag.add_operator("l", ListSource(left_windows, left_schema))
    right = dag.add_operator("r", ListSource(right_windows, right_schema))
    node = dag.add_operator("join", join)
    out = dag.add_operator("out", CollectSink())
    dag.add_stream("a", left.output, node.left)
    dag.add_stream("b", right.output, node.right)
    dag.add_stream("joined", node.output, out.input)
    return dag


def test_kept_rows_keep_their_types_and_keys_of_several_columns_and_nulls_match_nothing():
    ts = pa.timestamp("ms", tz="UTC")
    left_schema = pa.schema([("k", pa.string()), ("n", pa.int64()), ("at", ts),
                             ("v", pa.float64())])
    right_schema = pa.schema([("key", pa.string()), ("num", pa.int64()), ("at", ts),
                              ("w", pa.string())])
    left = [[{"k": "a", "n": 1, "at": 1_000, "v": 0.5}, {"k": None, "n": 1, "at": 5, "v": 1.0},
             {"k": "a", "n": 2, "at": 2_000, "v": 1.5}], [], []]
    right = [[], [{"key": "a", "num": 1, "at": 3_000, "w": "x"}],
             [{"key": None, "num": 1, "at": 4, "w": "null"},
              {"key": "a", "num": 1, "at": 4_000, "w": "y"}]]
    dag = _two_sided([pa.Table.from_pylist(w, left_schema) for w in left],
                     [pa.Table.from_pylist(w, right_schema) for w in right],
                     RegularJoin(["k", "n"], ttl_millis=60_000, right_keys=["key", "num"]),
                     left_schema, right_schema)
    rows = run_local(dag).rows("out")
    assert sorted((r["k"], r["n"], r["v"], r["w"], r["at"].timestamp(),
                   r["right_at"].timestamp()) for r in rows) == [
        ("a", 1, 0.5, "x", 1.0, 3.0), ("a", 1, 0.5, "y", 1.0, 4.0)]


def test_a_new_partition_joins_with_the_rows_its_keys_kept(tmp_path):
    from weir.operators.operator import OperatorContext
    from weir.operators.partitioning import PartitionFilter

    def context(folder, window=-1, index=0):
        return OperatorContext(name="join", operator_id=1, container_id="c",
                               state_dir=str(tmp_path / folder), recovered_window=window,
                               attributes={"PARTITION_KEY": "id"}, partition_index=index)

    def window(op, window_id, side, table):
        op.begin_window(window_id)
        op.process(side, table.to_batches()[0])
        op.end_window()

    left = pa.schema([("id", pa.int64()), ("name", pa.string())])
    right = pa.schema([("id", pa.int64()), ("item", pa.string())])
    old = []
    for i, ids in enumerate(([1, 2, 3], [4, 5])):
        op = RegularJoin("id", ttl_millis=3_600_000)
        op.setup(context(f"old{i}", index=i))
        window(op, 7, "left", pa.Table.from_pylist(
            [{"id": k, "name": f"p{k}"} for k in ids], left))
        old.append(op)
    matched = []
    for n in (0, 1):
        share = PartitionFilter("id", 1, frozenset({n}))
        new = RegularJoin("id", ttl_millis=3_600_000).repartitioned(old, share)
        new.schemas = {"left": left, "right": right}
        new.setup(context(f"new{n}", window=7, index=n))
        emitted = []
        new.connect_outputs(lambda port, batch, into=emitted: into.append(batch))
        ids = [k for k in range(1, 6) if share.owns([k])[0]]
        window(new, 8, "right", pa.Table.from_pylist(
            [{"id": k, "item": f"i{k}"} for k in range(1, 6)], right))
        new.teardown()
        got = [r for t in emitted for r in t.to_pylist()]
        assert sorted(r["id"] for r in got) == ids
        matched += [(r["id"], r["name"], r["item"]) for r in got]
    assert sorted(matched) == [(k, f"p{k}", f"i{k}") for k in range(1, 6)]
    for op in old:
        op.teardown()
