"""The joins through real processes: persons and auctions from two Parquet sources joined
per seller (WindowJoin: in 2-second tumbling event-time windows; IntervalJoin: auctions
from 0.5 s before to 1 s after the person; RegularJoin: every pair), the join's
container SIGKILLed at random moments; the pairs the exactly-once sink wrote are exactly
Python's join of the same rows, each once, and no row was late."""

from __future__ import annotations

import collections
import json
import os
import random
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.conftest import container_logs
from tests.e2e.test_exactly_once import chaos_seed, kill_operators_container
from tests.e2e.test_recovery import wait_finished
from tests.e2e.test_repartition import repartition_when_ready
from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(420)

SIZE_MS, SELLERS, ROWS = 2_000, 40, 12_000
LOWER_MS, UPPER_MS = -500, 1_000
JOINS = {"window": f'WindowJoin("seller", "ts", size_ms={SIZE_MS})',
         "interval": f'IntervalJoin("seller", "ts", {LOWER_MS}, {UPPER_MS})',
         "regular": 'RegularJoin("seller", ttl_millis=3_600_000)'}

APP = """
    from weir.operators import Dag
    from weir.operators.library import (FileSink, IntervalJoin, ParquetSource, RegularJoin,
                                        WindowJoin)

    dag = Dag("window-join", CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=3000,
              CHECKPOINT_WINDOW_COUNT=4, STATE_DIR={state!r}, MAX_RESTARTS=8)
    persons = dag.add_operator("persons", ParquetSource({persons!r}, rows_per_window=150,
                                                        batch_rows=100), CONTAINER=0,
                               EVENT_TIME_COLUMN="ts", WATERMARK_DELAY_MILLIS=0)
    auctions = dag.add_operator("auctions", ParquetSource({auctions!r}, rows_per_window=450,
                                                          batch_rows=300), CONTAINER=0,
                                EVENT_TIME_COLUMN="ts", WATERMARK_DELAY_MILLIS=0)
    join = dag.add_operator("join", {join}, CONTAINER=1)
    sink = dag.add_operator("sink", FileSink({out!r}, exactly_once=True), CONTAINER=2)
    late = dag.add_operator("late", FileSink({late!r}, exactly_once=True), CONTAINER=2)
    dag.add_stream("persons", persons.output, join.left)
    dag.add_stream("auctions", auctions.output, join.right)
    dag.add_stream("pairs", join.output, sink.input)
    dag.add_stream("late", join.late, late.input)
"""


def write_streams(root: Path, kind: str) -> collections.Counter:
    """Persons (a quarter of the rows) and auctions in event-time order, as Parquet
    folders; returns the reference join as a multiset of (seller, person, item, and the
    window's start or the auction's time)."""
    rng = random.Random(11)
    ts, rows = 1_790_000_000_000, []
    sellers = SELLERS * 50 if kind == "regular" else SELLERS  # every pair, time aside
    for _ in range(ROWS):
        ts += rng.choice((1, 2, 5, 9))
        rows.append((rng.random() < 0.25, rng.randrange(sellers), ts))
    people = [{"seller": s, "person": f"p{i}", "ts": t}
              for i, (is_person, s, t) in enumerate(rows) if is_person]
    items = [{"seller": s, "item": f"i{i}", "ts": t}
             for i, (is_person, s, t) in enumerate(rows) if not is_person]
    for name, table in (("persons", people), ("auctions", items)):
        folder = root / name
        folder.mkdir()
        for part in range(3):
            chunk = table[part * len(table) // 3:(part + 1) * len(table) // 3]
            pq.write_table(pa.Table.from_pylist(chunk), folder / f".{part}.tmp")
            os.replace(folder / f".{part}.tmp", folder / f"part-{part}.parquet")
    expected: collections.Counter = collections.Counter()
    if kind in ("interval", "regular"):
        by_seller: dict[int, list[dict]] = collections.defaultdict(list)
        for p in people:
            by_seller[p["seller"]].append(p)
        for a in items:
            for p in by_seller[a["seller"]]:
                if kind == "regular" or p["ts"] + LOWER_MS <= a["ts"] <= p["ts"] + UPPER_MS:
                    expected[(a["seller"], p["person"], a["item"], a["ts"])] += 1
        return expected
    by_window: dict[tuple[int, int], list[str]] = collections.defaultdict(list)
    for p in people:
        by_window[(p["seller"], p["ts"] - p["ts"] % SIZE_MS)].append(p["person"])
    for a in items:
        start = a["ts"] - a["ts"] % SIZE_MS
        for person in by_window.get((a["seller"], start), []):
            expected[(a["seller"], person, a["item"], start)] += 1
    return expected


@pytest.mark.parametrize("kind", sorted(JOINS))
def test_join_pairs_are_exact_after_sigkills_of_its_container(master, tmp_path, kind):
    rng, note = chaos_seed()
    expected = write_streams(tmp_path, kind)
    app = tmp_path / "join_app.py"
    app.write_text(textwrap.dedent(APP.format(
        state=str(tmp_path / "state"), persons=str(tmp_path / "persons"),
        auctions=str(tmp_path / "auctions"), join=JOINS[kind], out=str(tmp_path / "out"),
        late=str(tmp_path / "late"))))
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        kills = kill_operators_container(master, client, app_id, "join", rng, note,
                                         max_pause_s=1.5)
        wait_finished(client, master, app_id, timeout_s=240)
    assert kills >= 1, f"the run ended before a kill; {note}"
    rows = [json.loads(line) for file in sorted((tmp_path / "out").glob("*.jsonl"))
            for line in file.read_text().splitlines()]
    last = "window_start" if kind == "window" else "right_ts"
    got = collections.Counter((r["seller"], r["person"], r["item"], r[last]) for r in rows)
    assert not list((tmp_path / "late").glob("*.jsonl")) or not any(
        f.read_text().strip() for f in (tmp_path / "late").glob("*.jsonl")), note
    assert got == expected, (
        f"{note}: {sum((got - expected).values())} pairs too many, e.g. "
        f"{list(got - expected)[:3]}; {sum((expected - got).values())} missing, e.g. "
        f"{list(expected - got)[:3]}")


def test_a_window_join_repartitioned_mid_run_keeps_every_pair(master, tmp_path):
    expected = write_streams(tmp_path, "window")
    app = tmp_path / "join_app.py"
    app.write_text(textwrap.dedent(APP.format(
        state=str(tmp_path / "state"), persons=str(tmp_path / "persons"),
        auctions=str(tmp_path / "auctions"), join=JOINS["window"],
        out=str(tmp_path / "out"), late=str(tmp_path / "late"))).replace(
        'CONTAINER=1)', 'PARTITIONS=2, PARTITION_KEY="seller")').replace(
        "rows_per_window=150", "rows_per_window=60").replace(
        "rows_per_window=450", "rows_per_window=180"))
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        poll_for(lambda: any(f.read_text().strip() for f in (tmp_path / "out").glob("*.jsonl")),
                 120, f"the first pairs out\n{container_logs(master)}")
        repartition_when_ready(client, app_id, "join", 3)
        info = client.wait(app_id, 300)
        assert info.state == "FINISHED", f"{info.diagnostics}\n{container_logs(master)}"
    assert info.repartitions == 1
    rows = [json.loads(line) for file in sorted((tmp_path / "out").glob("*.jsonl"))
            for line in file.read_text().splitlines()]
    got = collections.Counter((r["seller"], r["person"], r["item"], r["window_start"])
                              for r in rows)
    assert got == expected, (f"{sum((got - expected).values())} pairs too many, "
                             f"{sum((expected - got).values())} missing")
