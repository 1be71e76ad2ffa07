"""TopN through the local runner: each key's top n rows per event-time window, ranked,
equal to a plain Python ranking of the same rows; late rows to ``late``; recovery."""

from __future__ import annotations

import collections
import random

import pyarrow as pa
import pytest

from weir.operators import Dag
from weir.operators.library import TopN
from weir.operators.testing import CollectSink, ListSource, run_local

BIDS = pa.schema([("auction", pa.int64()), ("price", pa.int64()), ("ts", pa.int64())])


def bids(seed: int, windows: int = 16):
    rng = random.Random(seed)
    return [[{"auction": rng.randrange(4), "price": rng.randrange(1_000),
              "ts": 1_000 * w + rng.randrange(1_000) - rng.randrange(300)}
             for _ in range(rng.randrange(12))] for w in range(windows)]


def top_dag(op: TopN, windows, **attributes) -> Dag:
    dag = Dag("top", **attributes)
    src = dag.add_operator("bids", ListSource(windows, BIDS), EVENT_TIME_COLUMN="ts",
                           WATERMARK_DELAY_MILLIS=400)
    node = dag.add_operator("top", op)
    out = dag.add_operator("out", CollectSink())
    late = dag.add_operator("late", CollectSink())
    dag.add_stream("bids", src.output, node.input)
    dag.add_stream("ranked", node.output, out.input)
    dag.add_stream("late", node.late, late.input)
    return dag


def reference(windows, n, size_ms, slide_ms, by_key=True):
    groups: dict[tuple, list[tuple[int, dict]]] = collections.defaultdict(list)
    arrival = 0
    for rows in windows:
        for row in rows:
            last = row["ts"] - row["ts"] % slide_ms
            for start in range(last, row["ts"] - size_ms, -slide_ms):
                groups[(row["auction"] if by_key else None, start)].append((arrival, row))
            arrival += 1
    out = set()
    for (_, start), rows in groups.items():
        ranked = sorted(rows, key=lambda r: (-r[1]["price"], r[0]))[:n]
        out |= {(r["auction"], r["price"], r["ts"], rank + 1, start, start + size_ms)
                for rank, (_, r) in enumerate(ranked)}
    return out


@pytest.mark.parametrize(("size_ms", "slide_ms"), [(2_000, None), (3_000, 1_000)])
def test_each_keys_top_rows_per_window_equal_a_plain_ranking(size_ms, slide_ms):
    windows = bids(seed=size_ms)
    run = run_local(top_dag(TopN("auction", "price", 3, "ts", size_ms, slide_ms), windows))
    assert run.rows("late") == []
    got = {(r["auction"], r["price"], r["ts"], r["rank"], r["window_start"],
            r["window_end"]) for r in run.rows("out")}
    assert len(run.rows("out")) == len(got)  # each ranked row once
    prices = {(a, p, t, s) for a, p, t, _, s, _ in got}
    expected = reference(windows, 3, size_ms, slide_ms or size_ms)
    # ties in price may rank either way; the prices at each rank must agree
    assert {(a, p, r, s) for a, p, _, r, s, _ in got} == \
        {(a, p, r, s) for a, p, _, r, s, _ in expected}
    assert prices <= {(a, p, t, s) for a, p, t, _, s, _ in
                      reference(windows, 100, size_ms, slide_ms or size_ms)}


def test_without_keys_one_ranking_per_window_and_late_rows_go_to_late(tmp_path):
    windows = [[{"auction": 1, "price": 5, "ts": 100}, {"auction": 2, "price": 9, "ts": 200}],
               [{"auction": 3, "price": 7, "ts": 5_000}],
               [{"auction": 4, "price": 99, "ts": 300}]]
    run = run_local(top_dag(TopN(None, "price", 1, "ts", 1_000), windows))
    assert [(r["auction"], r["rank"], r["window_start"]) for r in run.rows("out")] == [
        (2, 1, 0), (3, 1, 5_000)]
    assert [(r["auction"], r["late_reason"]) for r in run.rows("late")] == [
        (4, "its windows ended before it came")]


def test_a_recovered_run_ranks_the_same(tmp_path):
    windows = bids(seed=7, windows=24)
    make = lambda **a: top_dag(TopN("auction", "price", 2, "ts", 2_000), windows, **a)  # noqa: E731
    whole = run_local(make())
    first = run_local(make(CHECKPOINT_WINDOW_COUNT=3), stop_after_window=11,
                      checkpoint_dir=str(tmp_path))
    resumed = run_local(make(CHECKPOINT_WINDOW_COUNT=3), checkpoint_dir=str(tmp_path))
    before = [r for w, rows in sorted(first.windows("out").items()) for r in rows
              if w <= resumed.resumed_from]
    assert before + resumed.rows("out") == whole.rows("out")


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="n must be at least 1"):
        TopN("auction", "price", 0, "ts", 1_000)


def test_descending_false_ranks_the_lowest_first():
    windows = [[{"auction": 1, "price": p, "ts": 100 + p} for p in (5, 1, 9, 3)], []]
    run = run_local(top_dag(TopN("auction", "price", 2, "ts", 1_000, descending=False),
                            windows))
    assert [(r["price"], r["rank"]) for r in run.rows("out")] == [(1, 1), (3, 2)]
    high = run_local(top_dag(TopN("auction", "price", 2, "ts", 1_000), windows))
    assert [(r["price"], r["rank"]) for r in high.rows("out")] == [(9, 1), (5, 2)]
