"""Enrichment through real processes, the join's container SIGKILLed at random moments:
``TableJoin`` (a stream joined with a table kept from a changelog of upserts and deletes)
and ``LookupJoin`` (rows joined with a PostgreSQL table's). What the exactly-once sinks
wrote, matched and unmatched, is exactly Python's join of the same rows, each row once.

For ``TableJoin`` one source emits the changelog and the stream interleaved (a ``kind``
column), split in the same window, so that what a stream row meets does not depend on
how two sources' paces meet: epochs of changes, then lookups, then padding as long as a
window, so no window holds both a lookup of one epoch and a change of the next.
"""

from __future__ import annotations

import collections
import json
import os
import random
import uuid
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.test_exactly_once import chaos_seed, run_killing

pytestmark = pytest.mark.timeout(420)

WINDOW_ROWS, KEYS, EPOCHS = 150, 120, 14
CHANGES, LOOKUPS = 2 * WINDOW_ROWS, 6 * WINDOW_ROWS

SETTINGS = """CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=200, HEARTBEAT_INTERVAL_MILLIS=200,
              HEARTBEAT_TIMEOUT_MILLIS=3000, CHECKPOINT_WINDOW_COUNT=4, STATE_DIR={state!r},
              MAX_RESTARTS=8"""

TABLE_APP = """
    import pyarrow as pa
    import pyarrow.compute as pc
    from weir.operators import Dag, InputPort, Operator, OutputPort
    from weir.operators.library import FileSink, ParquetSource, TableJoin

    class Split(Operator):
        '''The changelog's rows to ``table``, the lookups to ``stream``, padding nowhere.'''

        input = InputPort()
        table = OutputPort()
        stream = OutputPort()

        def process(self, port, batch):
            kind = batch.column("kind")
            changes = batch.filter(pc.equal(kind, "change"))
            lookups = batch.filter(pc.equal(kind, "lookup"))
            if changes.num_rows:
                self.table.emit(changes.select(["product", "name", "deleted"]))
            if lookups.num_rows:
                self.stream.emit(lookups.select(["order", "product"]))

    dag = Dag("table-join", {settings})
    source = dag.add_operator("source", ParquetSource({inbox!r}, rows_per_window={rows},
                                                      batch_rows={half}), CONTAINER=0)
    split = dag.add_operator("split", Split(), CONTAINER=0)
    join = dag.add_operator("join", TableJoin("product", delete_column="deleted"),
                            CONTAINER=1)
    out = dag.add_operator("out", FileSink({out!r}, exactly_once=True), CONTAINER=2)
    missed = dag.add_operator("missed", FileSink({missed!r}, exactly_once=True), CONTAINER=2)
    dag.add_stream("events", source.output, split.input)
    dag.add_stream("changes", split.table, join.table)
    dag.add_stream("lookups", split.stream, join.stream)
    dag.add_stream("joined", join.output, out.input)
    dag.add_stream("unmatched", join.unmatched, missed.input)
"""

LOOKUP_APP = """
    from weir.operators import Dag
    from weir.operators.library import FileSink, LookupJoin, ParquetSource

    dag = Dag("lookup-join", {settings})
    source = dag.add_operator("source", ParquetSource({inbox!r}, rows_per_window={rows},
                                                      batch_rows={half}), CONTAINER=0)
    join = dag.add_operator("join", LookupJoin({dsn!r}, {table!r}, key="product",
                                               columns=["name"], table_key="id",
                                               cache_ttl_ms=1_000), CONTAINER=1)
    out = dag.add_operator("out", FileSink({out!r}, exactly_once=True), CONTAINER=2)
    missed = dag.add_operator("missed", FileSink({missed!r}, exactly_once=True), CONTAINER=2)
    dag.add_stream("orders", source.output, join.input)
    dag.add_stream("joined", join.output, out.input)
    dag.add_stream("unmatched", join.unmatched, missed.input)
"""


def _write_parquet(folder: Path, rows: list[dict], files: int = 4) -> None:
    folder.mkdir()
    for part in range(files):
        chunk = rows[part * len(rows) // files:(part + 1) * len(rows) // files]
        pq.write_table(pa.Table.from_pylist(chunk), folder / f".{part}.tmp")
        os.replace(folder / f".{part}.tmp", folder / f"part-{part}.parquet")


def changelog_and_lookups(rng: random.Random) -> tuple[list[dict], collections.Counter,
                                                        collections.Counter]:
    """The interleaved events, and the reference: (order, product, name) for each lookup
    that met a row, (order, product) for each that met none."""
    table: dict[int, str] = {}
    rows: list[dict] = []
    joined: collections.Counter = collections.Counter()
    missed: collections.Counter = collections.Counter()
    order = 0
    blank = {"order": None, "product": None, "name": None, "deleted": None}
    for epoch in range(EPOCHS):
        for _ in range(CHANGES):
            product = rng.randrange(KEYS)
            if rng.random() < 0.2:
                table.pop(product, None)
                rows.append(blank | {"kind": "change", "product": product, "deleted": True})
            else:
                table[product] = name = f"p{product}-v{epoch}-{rng.randrange(1000)}"
                rows.append(blank | {"kind": "change", "product": product, "name": name,
                                     "deleted": False})
        for _ in range(LOOKUPS):
            product = rng.randrange(KEYS + 10)  # some never in the table
            order += 1
            rows.append(blank | {"kind": "lookup", "order": order, "product": product})
            if product in table:
                joined[(order, product, table[product])] += 1
            else:
                missed[(order, product)] += 1
        rows.extend(blank | {"kind": "pad"} for _ in range(WINDOW_ROWS))
    return rows, joined, missed


def _written(folder: Path) -> list[dict]:
    return [json.loads(line) for file in sorted(folder.glob("*.jsonl"))
            for line in file.read_text().splitlines()]


def _check(got: collections.Counter, expected: collections.Counter, what: str,
           note: str) -> None:
    assert got == expected, (
        f"{note}: {what}: {sum((got - expected).values())} rows too many, e.g. "
        f"{list(got - expected)[:3]}; {sum((expected - got).values())} missing, e.g. "
        f"{list(expected - got)[:3]}")


def test_table_join_is_exact_after_sigkills_of_its_container(master, tmp_path):
    rng, note = chaos_seed()
    rows, joined, missed = changelog_and_lookups(rng)
    _write_parquet(tmp_path / "inbox", rows)
    run_killing(master, tmp_path / "app.py", TABLE_APP.format(
        settings=SETTINGS.format(state=str(tmp_path / "state")), inbox=str(tmp_path / "inbox"),
        rows=WINDOW_ROWS, half=WINDOW_ROWS // 2, out=str(tmp_path / "out"),
        missed=str(tmp_path / "missed")), "join", rng, note)
    _check(collections.Counter((r["order"], r["product"], r["name"])
                               for r in _written(tmp_path / "out")), joined, "joined", note)
    _check(collections.Counter((r["order"], r["product"]) for r in _written(
        tmp_path / "missed")), missed, "unmatched", note)
    assert joined and missed  # both kinds were exercised


@pytest.fixture
def products(postgres_dsn: str):
    name = f"weir_products_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, name TEXT)")
        with conn.cursor() as cursor:
            cursor.executemany(f"INSERT INTO {name} VALUES (%s, %s)",
                               [(i, f"product {i}") for i in range(0, KEYS, 2)])
    yield name
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute(f"DROP TABLE {name}")


def test_lookup_join_is_exact_after_sigkills_of_its_container(master, tmp_path,
                                                              postgres_dsn, products):
    rng, note = chaos_seed()
    orders = [{"order": i, "product": rng.randrange(KEYS)} for i in range(12_000)]
    _write_parquet(tmp_path / "inbox", orders)
    run_killing(master, tmp_path / "app.py", LOOKUP_APP.format(
        settings=SETTINGS.format(state=str(tmp_path / "state")), inbox=str(tmp_path / "inbox"),
        rows=WINDOW_ROWS, half=WINDOW_ROWS // 2, dsn=postgres_dsn, table=products,
        out=str(tmp_path / "out"), missed=str(tmp_path / "missed")), "join", rng, note)
    _check(collections.Counter((r["order"], r["product"], r["name"])
                               for r in _written(tmp_path / "out")),
           collections.Counter((o["order"], o["product"], f"product {o['product']}")
                               for o in orders if o["product"] % 2 == 0), "joined", note)
    _check(collections.Counter((r["order"], r["product"]) for r in _written(
        tmp_path / "missed")), collections.Counter(
        (o["order"], o["product"]) for o in orders if o["product"] % 2), "unmatched", note)
