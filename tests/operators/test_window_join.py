"""WindowJoin through the local runner: tumbling and sliding window joins equal a plain
Python join of the same rows; late rows go to ``late`` with a reason; recovery replays
exactly."""

from __future__ import annotations

import collections
import random

import pyarrow as pa
import pytest

from weir.operators import Dag
from weir.operators.dag import DagError
from weir.operators.library import WindowJoin
from weir.operators.testing import CollectSink, ListSource, run_local

PERSONS = pa.schema([("id", pa.int64()), ("name", pa.string()), ("ts", pa.int64())])
AUCTIONS = pa.schema([("seller", pa.int64()), ("item", pa.string()), ("ts", pa.int64()),
                      ("name", pa.string())])


def streams(seed: int, windows: int = 12, disorder_ms: int = 300):
    """Persons and auctions per streaming window, event time rising ~1 s a window, each
    row up to ``disorder_ms`` early."""
    rng = random.Random(seed)
    persons, auctions = [], []
    for w in range(windows):
        base = 1_000 * w + 1_000
        persons.append([{"id": rng.randrange(6), "name": f"p{rng.randrange(99)}",
                         "ts": base + rng.randrange(1_000) - rng.randrange(disorder_ms)}
                        for _ in range(rng.randrange(4))])
        auctions.append([{"seller": rng.randrange(6), "item": f"i{rng.randrange(99)}",
                          "ts": base + rng.randrange(1_000) - rng.randrange(disorder_ms),
                          "name": "auction"} for _ in range(rng.randrange(6))])
    return persons, auctions


def join_dag(join: WindowJoin, persons, auctions, delay_ms: int = 400, **attributes) -> Dag:
    dag = Dag("join", **attributes)
    left = dag.add_operator("persons", ListSource(persons, PERSONS), EVENT_TIME_COLUMN="ts",
                            WATERMARK_DELAY_MILLIS=delay_ms)
    right = dag.add_operator("auctions", ListSource(auctions, AUCTIONS),
                             EVENT_TIME_COLUMN="ts", WATERMARK_DELAY_MILLIS=delay_ms)
    node = dag.add_operator("join", join)
    out = dag.add_operator("out", CollectSink())
    late = dag.add_operator("late", CollectSink())
    dag.add_stream("p", left.output, node.left)
    dag.add_stream("a", right.output, node.right)
    dag.add_stream("joined", node.output, out.input)
    dag.add_stream("late", node.late, late.input)
    return dag


def reference(persons, auctions, size_ms: int, slide_ms: int) -> collections.Counter:
    expected: collections.Counter = collections.Counter()
    people = [p for w in persons for p in w]
    for a in (a for w in auctions for a in w):
        for p in people:
            if p["id"] != a["seller"]:
                continue
            for start in range(a["ts"] - a["ts"] % slide_ms, a["ts"] - size_ms, -slide_ms):
                if start <= p["ts"] < start + size_ms:
                    expected[(p["id"], p["name"], p["ts"], a["item"], a["ts"], a["name"],
                              start, start + size_ms)] += 1
    return expected


def joined(run) -> collections.Counter:
    return collections.Counter(
        (r["id"], r["name"], r["ts"], r["item"], r["right_ts"], r["right_name"],
         r["window_start"], r["window_end"]) for r in run.rows("out"))


@pytest.mark.parametrize(("size_ms", "slide_ms"), [(2_000, None), (3_000, 1_000)])
def test_a_window_join_equals_a_plain_join_of_the_same_rows(size_ms, slide_ms):
    persons, auctions = streams(seed=size_ms)
    join = WindowJoin(keys="id", time_column="ts", size_ms=size_ms,
                      slide_ms=slide_ms)
    auctions_as_id = [[{**a, "id": a.pop("seller")} for a in w] for w in auctions]
    schema = pa.schema([("id", pa.int64()), *list(AUCTIONS)[1:]])
    dag = join_dag(join, persons, [pa.Table.from_pylist(w, schema) for w in auctions_as_id])
    run = run_local(dag)
    assert run.rows("late") == []
    back = [[{**a, "seller": a["id"]} for a in w] for w in auctions_as_id]
    expected = reference(persons, back, size_ms, slide_ms or size_ms)
    assert sum(expected.values()) > 5
    assert joined(run) == expected


def test_a_row_after_its_window_closed_goes_to_late_with_the_reason():
    persons = [[{"id": 1, "name": "ann", "ts": 1_000}], [{"id": 1, "name": "bob", "ts": 5_000}],
               [{"id": 1, "name": "eve", "ts": 1_500}]]
    auctions = [[{"id": 1, "item": "x", "ts": 1_200, "name": "a"}],
                [{"id": 2, "item": "y", "ts": 5_000, "name": "a"}], []]  # both sides at 5 s
    schema = pa.schema([("id", pa.int64()), *list(AUCTIONS)[1:]])
    dag = join_dag(WindowJoin("id", "ts", size_ms=2_000), persons,
                   [pa.Table.from_pylist(w, schema) for w in auctions], delay_ms=0)
    run = run_local(dag)
    assert [(r["name"], r["item"]) for r in run.rows("out")] == [("ann", "x")]
    late = run.rows("late")
    assert [(r["name"], r["late_reason"]) for r in late] == [
        ("eve", "left: its partners' time had passed when it came")]


def test_a_recovered_join_emits_each_pair_once(tmp_path):
    persons, auctions = streams(seed=3, windows=16)
    schema = pa.schema([("id", pa.int64()), *list(AUCTIONS)[1:]])
    right = [pa.Table.from_pylist([{**a, "id": a.pop("seller")} for a in w], schema)
             for w in auctions]
    make = lambda: join_dag(WindowJoin("id", "ts", size_ms=2_000), persons, right,  # noqa: E731
                            CHECKPOINT_WINDOW_COUNT=3)
    whole = run_local(make())
    first = run_local(make(), stop_after_window=9, checkpoint_dir=str(tmp_path))
    resumed = run_local(make(), checkpoint_dir=str(tmp_path))
    before = [r for w, rows in sorted(first.windows("out").items()) for r in rows
              if w <= resumed.resumed_from]
    assert sorted(map(str, before + resumed.rows("out"))) == sorted(map(str, whole.rows("out")))
    assert whole.rows("out")


def test_bad_windows_are_refused_when_built():
    with pytest.raises(ValueError, match="slide_ms in"):
        WindowJoin("id", "ts", size_ms=1_000, slide_ms=2_000)
    with pytest.raises(ValueError, match="time_column"):
        WindowJoin("id", ("ts",), size_ms=1_000)


def test_the_right_side_may_name_its_key_otherwise():
    persons, auctions = streams(seed=21)
    dag = join_dag(WindowJoin("id", "ts", size_ms=2_000, right_keys="seller"), persons,
                   [pa.Table.from_pylist(w, AUCTIONS) for w in auctions])
    run = run_local(dag)
    expected = reference(persons, auctions, 2_000, 2_000)
    assert sum(expected.values()) > 5 and joined(run) == expected
    assert "seller" not in run.rows("out")[0]  # the left's id holds it
    with pytest.raises(ValueError, match="must pair with"):
        WindowJoin(["id", "name"], "ts", size_ms=1_000, right_keys="seller")


def test_each_sides_key_columns_are_checked_against_its_own_source_at_submit():
    class Declared(ListSource):
        def __init__(self, schema):
            super().__init__([], schema)

        def emitted_schema(self):
            return self.schema

    dag = Dag("join-check")
    left = dag.add_operator("persons", Declared(PERSONS), EVENT_TIME_COLUMN="ts")
    right = dag.add_operator("auctions", Declared(AUCTIONS), EVENT_TIME_COLUMN="ts")
    node = dag.add_operator("join", WindowJoin("id", "ts", 1_000, right_keys="sellr"))
    dag.add_stream("p", left.output, node.left)
    dag.add_stream("a", right.output, node.right)
    with pytest.raises(DagError, match="right_keys names column 'sellr', which 'auctions' "
                                       "does not emit.*did you mean 'seller'"):
        dag.to_descriptor()
    node.right_keys = ("seller",)
    dag.to_descriptor()  # the left's id is checked on the left only


def test_a_new_partition_keeps_its_keys_rows_of_the_old_partitions_chunks(tmp_path):
    from weir.operators.library.window_chunks import chunk_row
    from weir.operators.library.window_chunks import from_bytes as _from_bytes
    from weir.operators.operator import OperatorContext
    from weir.operators.partitioning import PartitionFilter

    def context(folder, window=-1, index=0):
        return OperatorContext(name="join", operator_id=1, container_id="c",
                               state_dir=str(tmp_path / folder), recovered_window=window,
                               attributes={"PARTITION_KEY": "id"}, partition_index=index)

    old = []
    for i, ids in enumerate(([1, 2, 3, 4], [5, 6, 7])):
        op = WindowJoin("id", "ts", 1_000, right_keys="seller")
        op.setup(context(f"old{i}", index=i))
        left = pa.table({"id": ids, "ts": [10] * len(ids)})
        right = pa.table({"seller": ids, "ts": [20] * len(ids)})
        op.schemas = {"left": left.schema, "right": right.schema}
        from weir.operators.library.window_chunks import to_bytes as _to_bytes
        op.store.put(7, [(chunk_row(0, "l", 7, i), _to_bytes(left), False),
                         (chunk_row(0, "r", 7, i), _to_bytes(right), False)])
        op.store_applied(7)
        old.append(op)
    kept: list[int] = []
    for n in (0, 1):
        share = PartitionFilter("id", 1, frozenset({n}))
        new = WindowJoin("id", "ts", 1_000, right_keys="seller").repartitioned(old, share)
        for _ in range(2):  # a retried deployment cuts nothing more
            new.setup(context(f"new{n}", window=7, index=n))
            chunks = [_from_bytes(data) for _, data in new.store.scan(b"w", b"x")]
            new.teardown()
        lefts = [v for t in chunks if "id" in t.column_names for v in t["id"].to_pylist()]
        rights = [v for t in chunks if "seller" in t.column_names
                  for v in t["seller"].to_pylist()]
        assert sorted(lefts) == sorted(rights)
        assert all(share.owns([v])[0] for v in lefts)
        kept += lefts
    assert sorted(kept) == [1, 2, 3, 4, 5, 6, 7]
    for op in old:
        op.teardown()
