"""Deduplicate and TopN through real processes, their container SIGKILLed at random
moments: bids (each sent once or more, in event-time order) deduplicated per (bidder,
auction) and ranked per auction and 2-second window; what the exactly-once sinks wrote
(the first bids, the repeats, each window's top three) is exactly Python's, each once.

The deduplication horizon is longer than the stream, so a key's first bid is its first
in file order whatever the windows; prices are distinct, so a ranking has no ties.
"""

from __future__ import annotations

import collections
import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.test_exactly_once import chaos_seed, run_killing

pytestmark = pytest.mark.timeout(420)

BIDS, BIDDERS, AUCTIONS, SIZE_MS, TOP = 12_000, 60, 40, 2_000, 3

APP = """
    from weir.operators import Dag
    from weir.operators.library import Deduplicate, FileSink, ParquetSource, TopN

    dag = Dag("dedup-top-n", CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=3000,
              CHECKPOINT_WINDOW_COUNT=4, STATE_DIR={state!r}, MAX_RESTARTS=8)
    bids = dag.add_operator("bids", ParquetSource({inbox!r}, rows_per_window=150,
                                                  batch_rows=75), CONTAINER=0,
                            EVENT_TIME_COLUMN="ts", WATERMARK_DELAY_MILLIS=0)
    first = dag.add_operator("first", Deduplicate(["bidder", "auction"], "ts",
                                                  within_ms=86_400_000), CONTAINER=1)
    top = dag.add_operator("top", TopN("auction", "price", {top}, "ts", {size}), CONTAINER=1)
    out = {{name: dag.add_operator(name, FileSink(str({root!r}) + "/" + name,
                                                 exactly_once=True), CONTAINER=2)
           for name in ("unique", "repeats", "ranked", "late")}}
    dag.add_stream("bids", bids.output, first.input, top.input)
    dag.add_stream("unique", first.output, out["unique"].input)
    dag.add_stream("repeats", first.duplicates, out["repeats"].input)
    dag.add_stream("ranked", top.output, out["ranked"].input)
    dag.add_stream("late", top.late, out["late"].input)
"""


def write_bids(folder: Path, rng: random.Random) -> list[dict]:
    """Bids in event-time order, a fifth of them sent again a little later."""
    ts, rows = 1_790_000_000_000, []
    prices = rng.sample(range(1, 10 * BIDS), BIDS)
    for i in range(BIDS):
        ts += rng.choice((1, 2, 3, 7))
        if rows and rng.random() < 0.2:
            again = dict(rng.choice(rows[-50:]))
            rows.append(again | {"ts": ts, "bid": f"b{i}", "price": prices[i]})
        else:
            rows.append({"bidder": rng.randrange(BIDDERS), "auction": rng.randrange(AUCTIONS),
                         "ts": ts, "bid": f"b{i}", "price": prices[i]})
    folder.mkdir()
    for part in range(4):
        chunk = rows[part * len(rows) // 4:(part + 1) * len(rows) // 4]
        pq.write_table(pa.Table.from_pylist(chunk), folder / f".{part}.tmp")
        os.replace(folder / f".{part}.tmp", folder / f"part-{part}.parquet")
    return rows


def _written(folder: Path) -> list[dict]:
    return [json.loads(line) for file in sorted(folder.glob("*.jsonl"))
            for line in file.read_text().splitlines()]


def test_deduplicate_and_top_n_are_exact_after_sigkills_of_their_container(master, tmp_path):
    rng, note = chaos_seed()
    rows = write_bids(tmp_path / "inbox", rng)
    seen: set[tuple[int, int]] = set()
    unique, repeats = collections.Counter(), collections.Counter()
    for row in rows:
        key = (row["bidder"], row["auction"])
        (repeats if key in seen else unique)[row["bid"]] += 1
        seen.add(key)
    windows: dict[tuple[int, int], list[tuple[int, str]]] = collections.defaultdict(list)
    for row in rows:
        windows[(row["auction"], row["ts"] - row["ts"] % SIZE_MS)].append(
            (row["price"], row["bid"]))
    ranked = collections.Counter(
        (auction, start, rank + 1, bid) for (auction, start), bids in windows.items()
        for rank, (_, bid) in enumerate(sorted(bids, reverse=True)[:TOP]))
    run_killing(master, tmp_path / "app.py", APP.format(
        state=str(tmp_path / "state"), inbox=str(tmp_path / "inbox"), top=TOP, size=SIZE_MS,
        root=str(tmp_path / "out")), "first", rng, note)
    out = tmp_path / "out"
    got = {name: collections.Counter(r["bid"] for r in _written(out / name))
           for name in ("unique", "repeats")}
    assert got["unique"] == unique, note
    assert got["repeats"] == repeats and repeats, note
    top = collections.Counter((r["auction"], r["window_start"], r["rank"], r["bid"])
                              for r in _written(out / "ranked"))
    assert top == ranked, (f"{note}: {sum((top - ranked).values())} too many, "
                           f"{sum((ranked - top).values())} missing")
    assert not _written(out / "late"), note
