"""EventTimeWindows against plain-Python references: out-of-order rows, watermarks given as
the runtime gives them, late rows on the ``late`` port, updates within the allowed
lateness, and the state that follows the open windows."""

from __future__ import annotations

import collections
import pickle
import random
from typing import Any

import pyarrow as pa
import pytest

from tests.operators.test_spark import Emitted, start
from weir.operators.library.event_windows import EventTimeWindows
from weir.operators.partitioning import PartitionFilter
from weir.operators.spark import SparkSchemaMismatch
from weir.operators.watermarks import END_OF_TIME, NO_WATERMARK, WATERMARKS_ATTRIBUTE, Watermarks
from weir.operators.windows import make_window_id
from weir.runtime.spark.bridge import SparkSessionBridge

SCHEMA = pa.schema([("ts", pa.timestamp("ms")), ("user", pa.string()), ("amount", pa.int64())])
AGGREGATIONS = {"n": "count(*)", "total": "sum(amount)"}
KEPT_ROWS = {"n": "count(*) + 0", "total": "sum(amount) + 0"}
"""The same values from windows that keep their rows (not aggregates of a row expression
alone, so not kept as partials per pane)."""
BOTH_STATES = pytest.mark.parametrize("aggregations", [AGGREGATIONS, KEPT_ROWS],
                                      ids=["panes", "rows"])
Row = tuple[int, str, int]  # event ms, user, amount


def batch(rows: list[Row]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"ts": t, "user": u, "amount": a} for t, u, a in rows], schema=SCHEMA)


def drive(op: EventTimeWindows, emitted: Emitted, chunks: list[list[Row]],
          watermarks: list[int], first: int = 0) -> list[list[dict[str, Any]]]:
    """Runs one streaming window per chunk, its END_WINDOW carrying the watermark; returns
    what each window emitted on ``output``."""
    marks = op.__dict__.setdefault(WATERMARKS_ATTRIBUTE, Watermarks(["input"]))
    out = []
    for index, (rows, watermark) in enumerate(zip(chunks, watermarks, strict=True)):
        before = len(emitted.rows())
        op.begin_window(make_window_id(1_700_000_000, first + index))
        if rows:
            op.process("input", batch(rows))
        marks.saw_input("input", watermark)
        marks.advance()
        op.end_window()
        out.append(emitted.rows()[before:])
    return out


def source_watermarks(chunks: list[list[Row]], delay_ms: int) -> list[int]:
    """What a source with that delay says after each chunk; the last says the end."""
    highest, marks = NO_WATERMARK, []
    for rows in chunks:
        highest = max([highest, *(t for t, _, _ in rows)])
        marks.append(highest - delay_ms if highest != NO_WATERMARK else NO_WATERMARK)
    return [*marks[:-1], END_OF_TIME]


def ms(value: Any) -> int:
    return int(value.timestamp() * 1000)


def final_results(emitted: Emitted) -> dict[tuple[str, int, int], tuple[int, int]]:
    """The last version of every window's result (later ones update earlier ones)."""
    results = {}
    for row in emitted.rows():
        results[(row["user"], ms(row["window_start"]), ms(row["window_end"]))] = (
            row["n"], row["total"])
    return results


def reference(chunks: list[list[Row]], watermarks: list[int], starts_of, last_end,
              lateness_ms: int) -> tuple[dict[tuple[str, int, int], tuple[int, int]],
                                         list[Row]]:
    """Windows by plain Python (as Flink assigns them): a row counts in each of its
    windows that had not ended, plus the lateness, by the watermark before the row's
    streaming window; a row with no such window is late."""
    before, late = NO_WATERMARK, []
    windows: dict[tuple[str, int, int], list[int]] = collections.defaultdict(lambda: [0, 0])
    for rows, watermark in zip(chunks, watermarks, strict=True):
        for t, user, amount in rows:
            if before != NO_WATERMARK and last_end(t) + lateness_ms <= before:
                late.append((t, user, amount))
                continue
            for first, end in starts_of(t):
                if before != NO_WATERMARK and end + lateness_ms <= before:
                    continue  # that window was closed for good
                windows[(user, first, end)][0] += 1
                windows[(user, first, end)][1] += amount
        before = max(before, watermark)
    return {k: (v[0], v[1]) for k, v in windows.items()}, late


def out_of_order(seed: int, count: int = 3_000, per_chunk: int = 150) -> list[list[Row]]:
    """Events 5 ms apart, 5 % of them up to 2 s late, three users; chunks in arrival order."""
    rng = random.Random(seed)
    base = 1_700_000_000_000
    events = []
    for i in range(count):
        t = base + i * 5
        arrival = t + (rng.randint(1, 2_000) if rng.random() < 0.05 else 0)
        events.append((arrival, (t, rng.choice("abc"), rng.randint(1, 9))))
    events.sort()
    rows = [row for _, row in events]
    return [rows[i:i + per_chunk] for i in range(0, len(rows), per_chunk)]


def late_rows(emitted: Emitted) -> list[Row]:
    return [(ms(r["ts"]), r["user"], r["amount"]) for r in emitted.rows("late")]


@BOTH_STATES
def test_tumbling_windows_match_the_reference_and_late_rows_go_to_the_late_port(
        bridge: SparkSessionBridge,
        aggregations: dict[str, str]) -> None:
    chunks = out_of_order(seed=1)
    watermarks = source_watermarks(chunks, delay_ms=500)
    op = EventTimeWindows.tumbling("ts", size_ms=1_000, keys="user", aggregations=aggregations)
    emitted = start(op, bridge)
    per_window = drive(op, emitted, chunks, watermarks)

    expected, late = reference(chunks, watermarks, lambda t: [(t - t % 1000, t - t % 1000 + 1000)],
                               lambda t: t - t % 1000 + 1000, lateness_ms=0)
    assert late, "the input must have rows beyond the lateness for this test to mean much"
    assert final_results(emitted) == expected
    assert sorted(late_rows(emitted)) == sorted(late)
    assert all(r["late_reason"].startswith("its windows ended") for r in emitted.rows("late"))
    assert op.late_rows == len(late)
    # without lateness every window goes out exactly once, and only once complete
    assert len(emitted.rows()) == len(expected)
    for rows, watermark in zip(per_window, watermarks, strict=True):
        assert all(ms(r["window_end"]) <= watermark for r in rows)
    assert op.open_rows == 0  # the end of time closed every window


@BOTH_STATES
def test_rows_within_the_allowed_lateness_update_the_window(bridge: SparkSessionBridge,
        aggregations: dict[str, str]) -> None:
    op = EventTimeWindows.tumbling("ts", size_ms=1_000, keys="user", aggregations=aggregations,
                                   allowed_lateness_ms=1_000)
    emitted = start(op, bridge)
    t0 = 1_700_000_000_000
    per_window = drive(op, emitted, [
        [(t0 + 100, "a", 1), (t0 + 900, "a", 2)],
        [(t0 + 1_500, "a", 4)],           # watermark 1_200: [0, 1000) goes out
        [(t0 + 300, "a", 8)],             # late by 200 ms < 1 s: [0, 1000) again, updated
        [(t0 + 2_500, "a", 16)],          # watermark 2_300: [0,1000) is closed for good
        [(t0 + 400, "a", 32)],            # later than the lateness: to the late port
    ], [t0 + 500, t0 + 1_200, t0 + 1_200, t0 + 2_300, END_OF_TIME])

    assert per_window[0] == []
    assert [(r["n"], r["total"]) for r in per_window[1]] == [(2, 3)]
    assert [(r["n"], r["total"]) for r in per_window[2]] == [(3, 11)]
    assert [(ms(r["window_start"]) - t0, r["n"]) for r in per_window[3]] == [(1_000, 1)]
    assert late_rows(emitted) == [(t0 + 400, "a", 32)]
    assert [(ms(r["window_start"]) - t0, r["total"]) for r in per_window[4]] == [(2_000, 16)]


@BOTH_STATES
@pytest.mark.parametrize("slide", [250, 300])  # 300: a row is in 3 or 4 windows
def test_sliding_windows_match_the_reference(bridge: SparkSessionBridge,
        aggregations: dict[str, str], slide: int) -> None:
    chunks = out_of_order(seed=2, count=1_500)
    watermarks = source_watermarks(chunks, delay_ms=300)
    op = EventTimeWindows.sliding("ts", size_ms=1_000, slide_ms=slide, keys="user",
                                  aggregations=aggregations, allowed_lateness_ms=200)
    emitted = start(op, bridge)
    drive(op, emitted, chunks, watermarks)

    def starts_of(t: int) -> list[tuple[int, int]]:
        last = t - t % slide
        return [(s, s + 1_000) for s in range(last, t - 1_000, -slide)]

    expected, late = reference(chunks, watermarks, starts_of,
                               lambda t: t - t % slide + 1_000, lateness_ms=200)
    assert late
    assert final_results(emitted) == expected
    assert sorted(late_rows(emitted)) == sorted(late)


@pytest.mark.slow
def test_partials_per_pane_give_what_the_rows_give(bridge: SparkSessionBridge) -> None:
    """count, sum, min, max and avg of row expressions, over sliding windows whose slide
    does not divide their size (panes of gcd(1000, 300) = 100 ms), with late updates:
    the same rows out as windows that keep their rows; the panes' state holds only the
    columns the aggregations read."""
    aggregations = {"n": "count(*)", "lo": "min(amount)", "hi": "MAX(amount)",
                    "mean": "avg(amount)", "twice": "sum(amount * 2)"}
    chunks = out_of_order(seed=4, count=1_500)
    watermarks = source_watermarks(chunks, delay_ms=300)
    outputs, states = [], []
    for aggs in (aggregations, {k: f"{v} + 0" for k, v in aggregations.items()}):
        op = EventTimeWindows.sliding("ts", size_ms=1_000, slide_ms=300, keys="user",
                                      aggregations=aggs, allowed_lateness_ms=400)
        emitted = start(op, bridge)
        marks = op.__dict__.setdefault(WATERMARKS_ATTRIBUTE, Watermarks(["input"]))
        for index, (rows, watermark) in enumerate(zip(chunks, watermarks, strict=True)):
            op.begin_window(make_window_id(1_700_000_000, index))
            unread = pa.array([f"https://example.com/{i}" for i in range(len(rows))])
            op.process("input", pa.RecordBatch.from_arrays(
                [*batch(rows).columns, unread], names=[*SCHEMA.names, "url"]))
            marks.saw_input("input", watermark)
            marks.advance()
            op.end_window()
            if index == len(chunks) // 2:
                states.append(op.pending)
        outputs.append(sorted(tuple(r.values()) for r in emitted.rows()))
        if len(outputs) == 1:  # the panes': every row not late went to Spark once
            rows_in = sum(map(len, chunks)) - op.late_rows
            costs = op.spark_costs()
            assert costs["rows_in"] == rows_in and 0 < costs["jobs"] <= len(chunks)
            assert costs["job_ms"] > 0 and costs["handoff_ms"] > 0
    assert outputs[0] == outputs[1] and len(outputs[0]) > 100
    assert states[0] is None or "url" not in states[0].schema.names
    assert "url" in states[1].schema.names  # the rows kept are whole


def test_session_windows_per_key(bridge: SparkSessionBridge) -> None:
    t0 = 1_700_000_000_000
    op = EventTimeWindows.session("ts", gap_ms=1_000, keys="user", aggregations=AGGREGATIONS)
    emitted = start(op, bridge)
    per_window = drive(op, emitted, [
        [(t0, "a", 1), (t0 + 500, "a", 2), (t0 + 200, "b", 4)],
        [(t0 + 1_400, "a", 8), (t0 + 3_000, "b", 16)],   # a: one session 0..1400
        [(t0 + 900, "a", 32), (t0 + 6_000, "a", 64)],    # out of order, in a's session
        [(t0 + 100, "b", 128)],                           # b's first session closed: late
    ], [t0 - 500, t0 + 2_000, t0 + 5_000, END_OF_TIME])

    assert per_window[0] == []
    # at 2_000 b's first session (200..1200) ended; a's goes on past it
    assert [(r["user"], ms(r["window_start"]) - t0, ms(r["window_end"]) - t0, r["total"])
            for r in per_window[1]] == [("b", 200, 1_200, 4)]
    # at 5_000: a's session 0..1400 (+1 s gap) with the out-of-order row; b's 3000 one
    assert sorted((r["user"], ms(r["window_start"]) - t0, ms(r["window_end"]) - t0, r["n"],
                   r["total"]) for r in per_window[2]) == [
        ("a", 0, 2_400, 4, 43), ("b", 3_000, 4_000, 1, 16)]
    assert late_rows(emitted) == [(t0 + 100, "b", 128)]
    assert [(r["user"], ms(r["window_start"]) - t0, r["total"]) for r in per_window[3]] == [
        ("a", 6_000, 64)]


def test_a_restored_operator_gives_the_same_results(bridge: SparkSessionBridge) -> None:
    """Checkpoint half-way (the operator pickled with its watermark), restore, go on: the
    same output as a run without the break."""
    chunks = out_of_order(seed=3, count=1_200)
    watermarks = source_watermarks(chunks, delay_ms=400)

    def fresh() -> EventTimeWindows:
        return EventTimeWindows.tumbling("ts", size_ms=500, keys="user",
                                         aggregations=AGGREGATIONS, allowed_lateness_ms=300)

    whole = fresh()
    whole_out = start(whole, bridge)
    drive(whole, whole_out, chunks, watermarks)

    half = len(chunks) // 2
    first = fresh()
    first_out = start(first, bridge)
    drive(first, first_out, chunks[:half], watermarks[:half])
    restored = pickle.loads(pickle.dumps(first))
    assert restored.watermark == first.watermark == watermarks[half - 1]
    assert restored.open_rows == first.open_rows > 0
    restored_out = start(restored, bridge)
    drive(restored, restored_out, chunks[half:], watermarks[half:], first=half)

    assert first_out.rows() + restored_out.rows() == whole_out.rows()
    assert first_out.rows("late") + restored_out.rows("late") == whole_out.rows("late")


@BOTH_STATES
def test_a_repartition_moves_the_state_with_its_keys(bridge: SparkSessionBridge,
                                                     aggregations: dict[str, str]) -> None:
    """Two partitions (by user) run half the stream, are merged into one (the default
    ``repartitioned``, as a scale-in does) that runs the rest: what all three emitted is
    what one operator emits for the whole stream."""
    chunks = out_of_order(seed=5, count=1_200)
    watermarks = source_watermarks(chunks, delay_ms=400)

    def fresh() -> EventTimeWindows:
        return EventTimeWindows.sliding("ts", size_ms=1_000, slide_ms=250, keys="user",
                                        aggregations=aggregations, allowed_lateness_ms=300)

    whole = fresh()
    whole_out = start(whole, bridge)
    drive(whole, whole_out, chunks, watermarks)
    half = len(chunks) // 2
    parts, outs = [], []
    for key in (0, 1):
        share = PartitionFilter("user", 1, frozenset({key}))
        op = fresh()
        outs.append(start(op, bridge))
        mine = [[row for row, own in zip(rows, share.owns(pa.array([u for _, u, _ in rows])),
                                         strict=True) if own] for rows in chunks[:half]]
        drive(op, outs[-1], mine, watermarks[:half])
        parts.append(pickle.loads(pickle.dumps(op)))
    merged = pickle.loads(pickle.dumps(parts[0])).repartitioned(parts, None)
    assert merged.open_rows == sum(p.open_rows for p in parts) > 0
    outs.append(start(merged, bridge))
    drive(merged, outs[-1], chunks[half:], watermarks[half:], first=half)
    assert sorted(tuple(r.values()) for out in outs for r in out.rows()) == \
        sorted(tuple(r.values()) for r in whole_out.rows())


@pytest.mark.parametrize(("aggregation", "value", "open_rows"), [
    ("count(*)", 100, 2),  # decomposable: a partial per key and pane (window)
    ("count(DISTINCT amount)", 1, 200),  # not: the open windows' rows
])
def test_the_state_holds_only_open_windows(bridge: SparkSessionBridge, aggregation: str,
                                           value: int, open_rows: int) -> None:
    op = EventTimeWindows.tumbling("ts", size_ms=1_000, keys="user", allowed_lateness_ms=500,
                                   aggregations={"v": aggregation})
    emitted = start(op, bridge)
    t0 = 1_700_000_000_000
    chunks = [[(t0 + second * 1_000 + i, "a", 1) for i in range(0, 1_000, 10)]
              for second in range(6)]
    drive(op, emitted, chunks, [t0 + second * 1_000 - 1 for second in range(6)])
    # the watermark is 4_999: windows up to [3000, 4000) are past their lateness;
    # [4000, 5000) and [5000, 6000) are open
    assert op.open_rows == open_rows
    assert [r["v"] for r in emitted.rows()] == [value] * 4


def test_no_job_runs_while_no_window_can_go_out(bridge: SparkSessionBridge) -> None:
    from tests.operators.test_spark import NoSpark

    op = EventTimeWindows.tumbling("ts", size_ms=10_000, keys="user")
    start(op, NoSpark())
    t0 = 1_700_000_000_000
    drive(op, Emitted(), [[(t0 + 10, "a", 1)], [(t0 + 20, "b", 1)]], [t0, t0 + 5_000])
    assert op.open_rows == 2


@pytest.mark.parametrize(("make", "says"), [
    (lambda: EventTimeWindows.tumbling("ts", size_ms=1_000, allowed_lateness_ms=-1),
     "allowed_lateness_ms must be 0 or more"),
    (lambda: EventTimeWindows.tumbling("ts", size_ms=0), "size_ms must be positive"),
    (lambda: EventTimeWindows.sliding("ts", size_ms=1_000, slide_ms=2_000),
     "slide_ms must be in (0, size_ms=1000]"),
    (lambda: EventTimeWindows.session("ts", gap_ms=0), "gap_ms must be positive"),
    (lambda: EventTimeWindows("hopping", "ts", size_ms=1), "kind must be one of"),
    (lambda: EventTimeWindows.tumbling("ts", 1_000, keys="n", aggregations={"n": "count(*)"}),
     "clash with the key or window columns"),
])
def test_bad_settings_are_refused_when_the_dag_is_built(make, says: str) -> None:
    with pytest.raises(ValueError, match="EventTimeWindows") as raised:
        make()
    assert says in str(raised.value)


@pytest.mark.parametrize(("schema", "says"), [
    (pa.schema([("time", pa.timestamp("ms")), ("user", pa.string())]),
     "event-time column 'ts' is not in its input (time, user)"),
    (pa.schema([("ts", pa.string()), ("user", pa.string())]),
     "event-time column 'ts' is string, not a timestamp"),
    (pa.schema([("ts", pa.int64()), ("who", pa.string())]),
     "key column(s) ['user'] are not in its input"),
])
def test_a_bad_input_names_the_operator_and_the_fix(schema: pa.Schema, says: str) -> None:
    from tests.operators.test_spark import NoSpark

    op = EventTimeWindows.tumbling("ts", size_ms=1_000, keys="user")
    start(op, NoSpark(), name="per-minute")
    rows = pa.RecordBatch.from_pylist([dict.fromkeys(schema.names)], schema=schema)
    with pytest.raises(SparkSchemaMismatch) as raised:
        op.process("input", rows)
    assert "'per-minute'" in str(raised.value) and says in str(raised.value)


class Counting:
    """A bridge, counting the jobs it runs (each brings a result back to Arrow)."""

    def __init__(self, bridge: SparkSessionBridge) -> None:
        self.bridge = bridge
        self.jobs = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.bridge, name)

    def to_arrow(self, df: Any) -> pa.Table:
        self.jobs += 1
        return self.bridge.to_arrow(df)


@pytest.mark.parametrize(("aggregations", "jobs_per_firing"), [(AGGREGATIONS, 1),
                                                                (KEPT_ROWS, 2)],
                         ids=["partials", "rows"])
def test_a_firing_session_window_runs_its_jobs(bridge: SparkSessionBridge,
                                               aggregations: dict[str, str],
                                               jobs_per_firing: int) -> None:
    """Partials per session: one job folds the new rows into fragments (a late row's
    session is known from them). Rows: one job brings the open rows back with their
    session's end (late rows and the rows kept are filtered from it), one aggregates;
    not a third for the late rows."""
    t0 = 1_700_000_000_000
    op = EventTimeWindows.session("ts", gap_ms=1_000, keys="user", aggregations=aggregations)
    counting = Counting(bridge)
    emitted = start(op, counting)
    jobs = []
    for index, (rows, watermark) in enumerate([([(t0, "a", 1), (t0 + 200, "b", 4)], t0 - 500),
                                               ([(t0 + 3_000, "b", 16)], t0 + 2_000),
                                               ([(t0 + 100, "b", 128)], t0 + 5_000)]):
        before = counting.jobs
        drive(op, emitted, [rows], [watermark], first=index)
        jobs.append(counting.jobs - before)
    assert jobs == [0, jobs_per_firing, jobs_per_firing]  # nothing out before t0 + 1_200
    assert late_rows(emitted) == [(t0 + 100, "b", 128)]
    assert op.open_rows == 0  # every session closed by t0 + 5_000


@pytest.mark.slow
def test_partials_per_session_give_what_the_rows_give(bridge: SparkSessionBridge) -> None:
    """Sessions of out-of-order rows with late updates and late rows, as partials per
    session and as kept rows: the same windows out, the same late rows."""
    aggregations = {"n": "count(*)", "lo": "min(amount)", "hi": "max(amount)",
                    "mean": "avg(amount)", "total": "sum(amount)"}
    base = 1_700_000_000_000
    chunks = [[(t + (t - base) // 250 * 300, user, amount) for t, user, amount in rows]
              for rows in out_of_order(seed=6, count=1_500)]  # a 300 ms gap every 250
    watermarks = source_watermarks(chunks, delay_ms=150)
    outputs, late, states = [], [], []
    for aggs in (aggregations, {k: f"{v} + 0" for k, v in aggregations.items()}):
        op = EventTimeWindows.session("ts", gap_ms=200, keys="user", aggregations=aggs,
                                      allowed_lateness_ms=300)
        emitted = start(op, bridge)
        drive(op, emitted, chunks, watermarks)
        outputs.append(sorted(tuple(r.values()) for r in emitted.rows()))
        late.append(sorted(late_rows(emitted)))
        states.append(op)
    assert outputs[0] == outputs[1] and len(outputs[0]) > 50
    assert late[0] == late[1] and late[0]
    # every row went to Spark once (a late one too: its session is known once merged)
    assert states[0].spark_costs()["rows_in"] == sum(map(len, chunks))


def test_sessions_merge_fragments_per_key_by_the_gap() -> None:
    """Fragments and sessions of a key join when one starts less than the gap after the
    latest end before it; null keys group together; keys far apart in time (too far to
    lift into one running maximum) still merge per key."""
    from weir.operators.library.window_panes import decompose
    from weir.operators.library.window_sessions import FIRST, LAST, Sessions

    sessions = Sessions(["k"], decompose({"n": "count(*)"}), gap_ms=10)
    far = 2**61
    fragments = pa.table({
        "k": ["a", "a", "a", None, None, "b", "b", "c"],
        FIRST: [0, 5, 40, 0, 9, far, far + 20, -far],
        LAST: [30, 8, 45, 0, 9, far + 14, far + 30, -far],
        "__weir_n": [3, 1, 2, 1, 1, 2, 2, 1]})
    merged = sessions.merge(None, fragments)
    assert sorted((tuple(row.values()) for row in merged.select(
        ["k", FIRST, LAST, "__weir_n"]).to_pylist()), key=str) == sorted([
        ("a", 0, 30, 4), ("a", 40, 45, 2), (None, 0, 9, 2), ("b", far, far + 30, 4),
        ("c", -far, -far, 1)], key=str)


def test_activate_warms_the_window_jobs_up_with_made_up_rows_within_its_budget(
        bridge: SparkSessionBridge) -> None:
    from weir.operators.operator import OperatorContext

    jobs = {}
    for millis in (0, 60_000):
        counting = Counting(bridge)
        op = EventTimeWindows.tumbling("ts", size_ms=1_000, keys="user")
        op.connect_outputs(Emitted())
        context = OperatorContext(name="op", operator_id=1, container_id="c0", spark=counting,
                                  attributes={"SPARK_WARMUP_ROWS": 5_000,
                                              "SPARK_WARMUP_MILLIS": millis})
        op.setup(context)
        assert counting.jobs == 0  # setup() is quick: the sources wait for it
        op.activate(context)
        jobs[millis] = counting.jobs
        assert op.pending is None and op.windows_out == 0  # nothing of it stays
    assert jobs == {0: 1, 60_000: 3}  # the first round always; the others within the budget


@pytest.mark.parametrize(("size", "slide"), [(1_000, 1_000), (1_000, 250), (1_000, 300)])
def test_whether_a_panes_window_ended_matches_its_windows(size: int, slide: int) -> None:
    """The cheap check (from the panes alone) against the windows the panes are in."""
    from weir.operators.library.window_panes import PANE, TOUCHED, Panes, decompose

    panes = Panes(["k"], decompose({"n": "count(*)"}), size, slide)
    rng = random.Random(size + slide)
    starts = sorted({rng.randrange(0, 20_000) // panes.pane_ms * panes.pane_ms
                     for _ in range(5)})
    state = pa.table({"k": ["a"] * len(starts), PANE: pa.array(starts, pa.int64()),
                      "__weir_n": pa.array([1] * len(starts), pa.int64()),
                      TOUCHED: [True] * len(starts)})
    ends = panes.window_ends(panes.windows(state)).to_pylist()
    for before in [NO_WATERMARK, *range(-1_000, 22_000, 97)]:
        now = before + rng.choice([1, 50, 300, 2_000])
        assert panes.a_window_ended(state, before, now) == any(
            before < end <= now for end in ends), (before, now, ends)
