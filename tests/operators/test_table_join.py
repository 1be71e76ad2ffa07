"""TableJoin through the local runner: stream rows enriched with their key's latest
table row (changes of a window apply before its stream rows), deletes, left and inner
joins with unmatched rows kept, and recovery."""

from __future__ import annotations

import pyarrow as pa
import pytest

from weir.operators import Dag
from weir.operators.library import TableJoin
from weir.operators.testing import CollectSink, ListSource, run_local

PRICES = pa.schema([("product", pa.string()), ("price", pa.int64()),
                    ("deleted", pa.bool_())])
ORDERS = pa.schema([("order", pa.int64()), ("product", pa.string()), ("qty", pa.int64())])

TABLE = [[{"product": "a", "price": 10, "deleted": False},
          {"product": "b", "price": 20, "deleted": False}],
         [{"product": "a", "price": 11, "deleted": False}],
         [{"product": "b", "price": 0, "deleted": True}], []]
STREAM = [[{"order": 1, "product": "a", "qty": 1}],
          [{"order": 2, "product": "a", "qty": 2}, {"order": 3, "product": "b", "qty": 3}],
          [{"order": 4, "product": "b", "qty": 4}, {"order": 5, "product": "c", "qty": 5}],
          [{"order": 6, "product": "a", "qty": 6}]]


def table_dag(join: TableJoin, **attributes) -> Dag:
    dag = Dag("enrich", **attributes)
    table = dag.add_operator("prices", ListSource(TABLE, PRICES))
    stream = dag.add_operator("orders", ListSource(STREAM, ORDERS))
    node = dag.add_operator("join", join)
    out = dag.add_operator("out", CollectSink())
    missed = dag.add_operator("missed", CollectSink())
    dag.add_stream("t", table.output, node.table)
    dag.add_stream("s", stream.output, node.stream)
    dag.add_stream("o", node.output, out.input)
    dag.add_stream("u", node.unmatched, missed.input)
    return dag


def test_each_stream_row_meets_its_keys_latest_table_row():
    run = run_local(table_dag(TableJoin("product", delete_column="deleted")))
    assert [(r["order"], r["price"]) for r in run.rows("out")] == [
        (1, 10), (2, 11), (3, 20), (6, 11)]
    assert [r["order"] for r in run.rows("missed")] == [4, 5]  # b deleted, c never there
    assert "deleted" not in run.rows("out")[0]


def test_a_left_join_keeps_unmatched_rows_with_nulls_and_recovers(tmp_path):
    expected = [(1, 10), (2, 11), (3, 20), (4, None), (5, None), (6, 11)]
    whole = run_local(table_dag(TableJoin("product", how="left", delete_column="deleted")))
    assert sorted((r["order"], r["price"]) for r in whole.rows("out")) == expected
    make = lambda: table_dag(TableJoin("product", how="left", delete_column="deleted"),  # noqa: E731
                             CHECKPOINT_WINDOW_COUNT=2)
    first = run_local(make(), stop_after_window=3, checkpoint_dir=str(tmp_path))
    resumed = run_local(make(), checkpoint_dir=str(tmp_path))
    before = [r for w, rows in sorted(first.windows("out").items()) for r in rows
              if w <= resumed.resumed_from]
    assert sorted((r["order"], r["price"]) for r in before + resumed.rows("out")) == expected


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="'inner' or 'left'"):
        TableJoin("product", how="outer")
    with pytest.raises(ValueError, match="must pair"):
        TableJoin("product", table_keys=["a", "b"])


def test_a_table_keyed_otherwise_and_a_clashing_column_get_their_names():
    table = [[{"sku": "a", "qty": 100, "deleted": False}], [], [], []]
    schema = pa.schema([("sku", pa.string()), ("qty", pa.int64()), ("deleted", pa.bool_())])
    dag = Dag("enrich")
    t = dag.add_operator("stock", ListSource(table, schema))
    s = dag.add_operator("orders", ListSource(STREAM, ORDERS))
    node = dag.add_operator("join", TableJoin("product", table_keys="sku", how="left",
                                              table_prefix="stock_"))
    out = dag.add_operator("out", CollectSink())
    dag.add_stream("t", t.output, node.table)
    dag.add_stream("s", s.output, node.stream)
    dag.add_stream("o", node.output, out.input)
    rows = run_local(dag).rows("out")
    assert list(rows[0]) == ["order", "product", "qty", "stock_qty", "deleted"]
    assert sorted((r["order"], r["stock_qty"]) for r in rows)[:3] == [
        (1, 100), (2, 100), (3, None)]
