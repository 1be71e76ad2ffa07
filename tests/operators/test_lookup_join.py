"""LookupJoin against a real PostgreSQL server: rows enriched with their key's table row,
misses to ``unmatched`` (or nulls with a left join), one query per window for the keys
the cache lacks, the cache trusted for its TTL, and a missing table refused at setup."""

from __future__ import annotations

import uuid

import psycopg
import pyarrow as pa
import pytest

from weir.operators import Dag
from weir.operators.library import LookupJoin
from weir.operators.testing import CollectSink, ListSource, LocalRunError, run_local

ORDERS = pa.schema([("order", pa.int64()), ("product", pa.int64())])
WINDOWS = [[{"order": 1, "product": 10}, {"order": 2, "product": 11}],
           [{"order": 3, "product": 10}, {"order": 4, "product": 99}],
           [{"order": 5, "product": 11}]]


@pytest.fixture
def products(postgres_dsn: str) -> str:
    name = f"weir_products_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, name TEXT, "
                     "price NUMERIC(8, 2))")
        conn.execute(f"INSERT INTO {name} VALUES (10, 'pen', 1.50), (11, 'ink', 7.25)")
    yield name
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute(f"DROP TABLE {name}")


def lookup_dag(join: LookupJoin) -> tuple[Dag, LookupJoin]:
    dag = Dag("lookup")
    src = dag.add_operator("orders", ListSource(WINDOWS, ORDERS))
    node = dag.add_operator("join", join)
    out = dag.add_operator("out", CollectSink())
    missed = dag.add_operator("missed", CollectSink())
    dag.add_stream("o", src.output, node.input)
    dag.add_stream("j", node.output, out.input)
    dag.add_stream("u", node.unmatched, missed.input)
    return dag, join


def test_rows_meet_their_keys_table_row_and_misses_are_kept(postgres_dsn, products):
    dag, _ = lookup_dag(LookupJoin(postgres_dsn, products, key="product",
                                   columns=["name", "price"], table_key="id"))
    run = run_local(dag)
    assert sorted((r["order"], r["name"], r["price"]) for r in run.rows("out")) == [
        (1, "pen", "1.50"), (2, "ink", "7.25"), (3, "pen", "1.50"), (5, "ink", "7.25")]
    assert [r["order"] for r in run.rows("missed")] == [4]
    left, _ = lookup_dag(LookupJoin(postgres_dsn, products, key="product", columns=["name"],
                                    table_key="id", how="left"))
    assert sorted((r["order"], r["name"]) for r in run_local(left).rows("out")) == [
        (1, "pen"), (2, "ink"), (3, "pen"), (4, None), (5, "ink")]


@pytest.mark.parametrize(("ttl_ms", "lookups", "hits"), [(60_000, 2, 2), (0, 3, 0)])
def test_the_cache_saves_queries_for_its_ttl(postgres_dsn, products, ttl_ms, lookups, hits):
    dag, _ = lookup_dag(LookupJoin(postgres_dsn, products, key="product", columns=["name"],
                                   table_key="id", cache_ttl_ms=ttl_ms))
    join = run_local(dag).operator("join")
    assert (join.lookups, join.cache_hits) == (lookups, hits)


def test_a_table_or_column_that_is_not_there_fails_at_setup(postgres_dsn, products):
    dag, _ = lookup_dag(LookupJoin(postgres_dsn, products, key="product",
                                   columns=["colour"], table_key="id"))
    with pytest.raises(LocalRunError, match="cannot read .*colour"):
        run_local(dag)


def test_the_cache_holds_at_most_cache_rows(postgres_dsn, products):
    dag, _ = lookup_dag(LookupJoin(postgres_dsn, products, key="product", columns=["name"],
                                   table_key="id", cache_rows=1))
    join = run_local(dag).operator("join")
    # one row kept: every window asks again (a cache of any size: 2 lookups, 2 hits)
    assert (join.lookups, join.cache_hits) == (3, 0)


def test_a_looked_up_column_the_input_has_too_gets_the_prefix(postgres_dsn, products):
    named = pa.schema([*ORDERS, ("name", pa.string())])
    dag = Dag("lookup")
    src = dag.add_operator("orders", ListSource(
        [[{"order": 1, "product": 10, "name": "mine"}]], named))
    node = dag.add_operator("join", LookupJoin(postgres_dsn, products, key="product",
                                               columns=["name"], table_key="id",
                                               table_prefix="db_"))
    out = dag.add_operator("out", CollectSink())
    dag.add_stream("o", src.output, node.input)
    dag.add_stream("j", node.output, out.input)
    assert run_local(dag).rows("out") == [
        {"order": 1, "product": 10, "name": "mine", "db_name": "pen"}]
