"""KeyedProcess through the local runner: per-key state of each kind, event- and
processing-time timers, TTL, typed state and output, and recovery from a checkpoint."""

from __future__ import annotations

import collections
import pickle

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from weir.operators import Dag
from weir.operators.library import KeyedProcess, ListState, MapState, ValueState
from weir.operators.library.key_state import key_of_row, state_row, timer_row
from weir.operators.operator import OperatorContext
from weir.operators.partitioning import PartitionFilter
from weir.operators.ports import SchemaMismatch
from weir.operators.testing import CollectSink, ListSource, LocalRunError, run_local
from weir.operators.windows import window_end_millis

EVENTS = pa.schema([("user", pa.string()), ("ts", pa.int64()), ("amount", pa.int64())])
IDLE_MS = 1_000


class Totals(KeyedProcess):
    """A running total per user, emitted each window the user appears in."""

    STATE = {"total": ValueState(pa.int64())}
    OUTPUT = pa.schema([("user", pa.string()), ("total", pa.int64())])

    def process_key(self, key, rows, ctx):
        total = (ctx.state.total.value or 0) + pc.sum(rows["amount"]).as_py()
        ctx.state.total.update(total)
        ctx.emit(user=key, total=total)


class IdleAlert(KeyedProcess):
    """Says once a user has sent nothing for IDLE_MS of event time (one event-time timer
    per user, moved forward by every event)."""

    STATE = {"last": ValueState(pa.int64())}
    OUTPUT = pa.schema([("user", pa.string()), ("idle_from", pa.int64())])

    def process_key(self, key, rows, ctx):
        last = ctx.state.last.value
        newest = max(rows["ts"].to_pylist())
        if last is not None:
            if newest <= last:
                return
            ctx.timers.delete_event_time(last + IDLE_MS)
        ctx.state.last.update(newest)
        ctx.timers.event_time(newest + IDLE_MS)

    def on_timer(self, key, timer, ctx):
        assert timer.kind == "event" and ctx.watermark >= timer.time
        ctx.emit(user=key, idle_from=ctx.state.last.value)
        ctx.state.last.clear()


def events(windows: list[list[tuple[str, int, int]]]) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pylist([{"user": u, "ts": t, "amount": a} for u, t, a in w],
                                       schema=EVENTS) for w in windows]


def pipeline(op: KeyedProcess, windows: list[pa.RecordBatch], **attributes) -> Dag:
    dag = Dag("keyed", **attributes)
    src = dag.add_operator("src", ListSource(windows), EVENT_TIME_COLUMN="ts",
                           WATERMARK_DELAY_MILLIS=0)
    op_node = dag.add_operator("op", op)
    sink = dag.add_operator("sink", CollectSink())
    dag.add_stream("events", src.output, op_node.input)
    dag.add_stream("out", op_node.output, sink.input)
    return dag


WINDOWS = [[("a", 100, 1), ("b", 150, 2), ("a", 180, 3)], [("b", 400, 5)], [],
           [("a", 1_300, 7), ("c", 1_350, 1)], [("c", 1_900, 2)], [("b", 3_000, 1)]]


def test_a_value_state_per_key_carries_over_windows():
    run = run_local(pipeline(Totals(keys="user"), events(WINDOWS)))
    rows = run.rows("sink")
    running: collections.Counter[str] = collections.Counter()
    expected = []
    for window in WINDOWS:
        seen: dict[str, int] = {}
        for user, _, amount in window:
            running[user] += amount
            seen[user] = running[user]
        expected += [{"user": u, "total": t} for u, t in sorted(seen.items())]
    assert rows == expected


def test_event_time_timers_fire_once_the_watermark_passes_them_and_deleted_ones_never():
    run = run_local(pipeline(IdleAlert(keys="user"), events(WINDOWS)))
    by_window = [rows for _, rows in sorted(run.windows("sink").items()) if rows]
    # a goes idle at 1,180 (its timer at 180 + 1,000 was moved to 2,300 by its event at
    # 1,300); b at 1,400 (ts 400) once the watermark reaches 1,900; then the end of the
    # input fires every timer left: a (1,300), c (1,900), b (3,000)
    assert by_window[0] == [{"user": "b", "idle_from": 400}]
    assert sorted(map(tuple, (r.values() for r in by_window[1]))) == [
        ("a", 1_300), ("b", 3_000), ("c", 1_900)]
    assert sum(len(w) for w in by_window) == 4


class EveryWindow(KeyedProcess):
    """A processing-time timer 1 ms after each event's window ends: fires at the end of the
    next window (after that window's rows), on the application's clock."""

    STATE = {"seen": ListState(pa.int64()), "pages": MapState(pa.string(), pa.int64())}
    OUTPUT = pa.schema([("user", pa.string()), ("fired_at", pa.int64()),
                        ("window_time", pa.int64()), ("seen", pa.list_(pa.int64())),
                        ("pages", pa.int64())])

    def process_key(self, key, rows, ctx):
        ctx.state.seen.extend(rows["ts"].to_pylist())
        for amount in rows["amount"].to_pylist():
            ctx.state.pages[f"p{amount}"] = ctx.state.pages.get(f"p{amount}", 0) + 1
        ctx.timers.processing_time(ctx.window_time + 1)

    def on_timer(self, key, timer, ctx):
        assert timer.kind == "processing"
        ctx.emit(user=key, fired_at=timer.time, window_time=ctx.window_time,
                 seen=ctx.state.seen.get(), pages=len(ctx.state.pages))


def test_processing_time_timers_fire_at_the_next_window_end_with_list_and_map_state():
    run = run_local(pipeline(EveryWindow(keys="user"), events(WINDOWS[:2])))
    windows = sorted(run.windows("sink").items())
    fired = [(w, r) for w, rows in windows for r in rows]
    # the second window's rows come first, then its due timers; b's timer from the second
    # window is pending when the input ends: processing-time timers then do not fire
    assert [(r["user"], r["seen"], r["pages"]) for _, r in fired] == [
        ("a", [100, 180], 2), ("b", [150, 400], 2)]
    first_window = windows[0][0]
    for window_id, row in fired:
        assert row["window_time"] == window_end_millis(window_id, 500)
        assert row["fired_at"] <= row["window_time"]
    assert fired[0][0] > first_window  # not in the window that set it


def test_a_key_untouched_for_the_ttl_starts_again_from_empty_state():
    windows = [[("a", 0, 1)], [("a", 10, 2)], [], [], [], [("a", 20, 4)]]
    run = run_local(pipeline(Totals(keys="user", ttl_millis=1_500), events(windows),
                             STREAMING_WINDOW_SIZE_MILLIS=500))
    assert [r["total"] for r in run.rows("sink")] == [1, 3, 4]
    kept = run_local(pipeline(Totals(keys="user"), events(windows)))
    assert [r["total"] for r in kept.rows("sink")] == [1, 3, 7]


def test_several_key_columns_make_a_tuple_key():
    class Pairs(KeyedProcess):
        STATE = {"n": ValueState(pa.int64())}
        OUTPUT = pa.schema([("user", pa.string()), ("amount", pa.int64()), ("n", pa.int64())])

        def process_key(self, key, rows, ctx):
            n = (ctx.state.n.value or 0) + rows.num_rows
            ctx.state.n.update(n)
            ctx.emit(user=key[0], amount=key[1], n=n)

    run = run_local(pipeline(Pairs(keys=["user", "amount"]),
                             events([[("a", 0, 1), ("a", 1, 1), ("a", 2, 2)], [("a", 3, 1)]])))
    assert run.rows("sink") == [{"user": "a", "amount": 1, "n": 2},
                                {"user": "a", "amount": 2, "n": 1},
                                {"user": "a", "amount": 1, "n": 3}]


def test_a_state_value_of_the_wrong_type_is_refused_naming_the_state():
    class Wrong(Totals):
        def process_key(self, key, rows, ctx):
            ctx.state.total.update("lots")

    with pytest.raises(LocalRunError, match="state 'total' is declared int64; 'lots'"):
        run_local(pipeline(Wrong(keys="user"), events(WINDOWS[:1])))


def test_emitted_rows_must_fit_the_declared_output():
    class Extra(Totals):
        def process_key(self, key, rows, ctx):
            ctx.emit(user=key, total=1, surprise=2)

    with pytest.raises(LocalRunError, match=r"emitted column\(s\) \['surprise'\]") as info:
        run_local(pipeline(Extra(keys="user"), events(WINDOWS[:1])))
    assert isinstance(info.value.__cause__, SchemaMismatch)
    with pytest.raises(TypeError, match="declare OUTPUT"):
        type("NoOutput", (KeyedProcess,), {"process_key": Totals.process_key})(keys="user")
    with pytest.raises(TypeError, match="define process_key"):
        type("NoFunction", (KeyedProcess,), {"OUTPUT": Totals.OUTPUT})(keys="user")
    with pytest.raises(ValueError, match="keys must name"):
        Totals(keys=[])


def test_a_recovered_run_replays_onto_the_checkpointed_store_and_ends_exactly(tmp_path):
    windows = events(WINDOWS * 3)
    reference = run_local(pipeline(IdleAlert(keys="user"), windows)).rows("sink")
    dag = pipeline(IdleAlert(keys="user"), windows, CHECKPOINT_WINDOW_COUNT=4)
    first = run_local(dag, stop_after_window=11, checkpoint_dir=str(tmp_path))
    assert not first.finished
    resumed = run_local(dag, checkpoint_dir=str(tmp_path))
    assert resumed.resumed_from >= 0
    before = [r for w, rows in sorted(first.windows("sink").items()) for r in rows
              if w <= resumed.resumed_from]
    assert before + resumed.rows("sink") == reference


def test_a_missing_key_column_is_a_schema_mismatch():
    op = Totals(keys="customer")
    with pytest.raises((LocalRunError, SchemaMismatch), match="customer"):
        run_local(pipeline(op, events(WINDOWS[:1])))


def _context(state_dir, window: int = -1) -> OperatorContext:
    return OperatorContext(name="op", operator_id=1, container_id="c", state_dir=str(state_dir),
                           attributes={"PARTITION_KEY": "user"}, recovered_window=window)


def test_a_new_partition_takes_its_keys_state_and_timers_out_of_the_old_stores(tmp_path):
    old = []
    for i, users in enumerate((["a", "b", "c"], ["d", "e"])):
        op = Totals(keys="user")
        op.setup(_context(tmp_path / f"old{i}"))
        rows = [(state_row((u,)), pickle.dumps({"total": n}), True) for n, u in enumerate(users)]
        rows += [(timer_row("e", 1_000 + n, (u,)), b"", False) for n, u in enumerate(users)]
        op.store.put(5, sorted(rows))
        op.store_applied(5)
        old.append(op)
    shares = [PartitionFilter("user", 1, frozenset({k})) for k in (0, 1)]
    moved: list[tuple[str, ...]] = []
    for n, share in enumerate(shares):
        new = Totals(keys="user").repartitioned(old, share)
        new.setup(_context(tmp_path / f"new{n}", window=5))
        stored = new.store.scan(b"", b"\xff")
        states = {key_of_row(k) for k, _ in stored if k[:1] == b"s"}
        timers = {key_of_row(k) for k, _ in stored if k[:1] == b"e"}
        assert states == timers and all(share.owns([key[0]])[0] for key in states)
        moved += sorted(states)
        new.teardown()
    assert sorted(moved) == [(u,) for u in "abcde"]
    for op in old:
        op.teardown()


def test_a_new_partition_redeployed_before_its_first_checkpoint_replays_from_its_seed(
        tmp_path):
    """A container holding a new partition dies after it applied windows but before it
    checkpointed: the redeploy restores the seed handle, so the store must undo those
    windows (it is seeded already) for the replay to apply them again."""
    from weir.runtime.operator_state import capture, restore

    old = Totals(keys="user")
    old.setup(_context(tmp_path / "old"))
    old.store.put(5, [(state_row(("a",)), pickle.dumps({"total": 1}), True)])
    old.store_applied(5)
    first = Totals(keys="user").repartitioned([old], None)
    saved = capture(first)  # its initial checkpoint: the seed handle
    first.setup(_context(tmp_path / "new", window=5))
    first.store.put(6, [(state_row(("a",)), pickle.dumps({"total": 2}), True)])
    first.store_applied(6)
    first.teardown()  # the container is killed here

    again = restore(Totals(keys="user"), saved)
    again.setup(_context(tmp_path / "new", window=5))
    assert again.store.applied == 5
    assert [pickle.loads(v) for _, v in again.store.scan(b"", b"\xff")] == [{"total": 1}]
    again.store.put(6, [(state_row(("a",)), pickle.dumps({"total": 2}), True)])  # the replay
    again.teardown()
    old.teardown()


def test_split_late_keeps_rows_on_time_and_says_why_the_others_are_late():
    from weir.operators.watermarks import split_late

    rows = pa.table({"ts": pa.array([5, None, 20], pa.int64()), "v": [1, 2, 3]})
    kept, late = split_late(rows, "ts", lambda ms: ms < 10, "too old")
    assert kept["v"].to_pylist() == [3]
    assert list(zip(late["v"].to_pylist(), late["late_reason"].to_pylist(), strict=True)) == [
        (1, "too old"), (2, "no ts (event time)")]
    kept, late = split_late(rows.slice(2), "ts", lambda ms: ms < 10, "too old")
    assert kept.num_rows == 1 and late.num_rows == 0 and "late_reason" in late.column_names


def test_a_windows_key_work_runs_with_the_cycle_collector_off_and_restores_it():
    import gc

    from weir.operators.library.keyed_process import no_gc_pauses

    seen = []
    with no_gc_pauses():
        seen.append(gc.isenabled())
    assert seen == [False] and gc.isenabled()
    with pytest.raises(RuntimeError), no_gc_pauses():
        raise RuntimeError("a failing window")
    assert gc.isenabled()  # back on after a failure too
    gc.disable()
    try:
        with no_gc_pauses():
            pass
        assert not gc.isenabled()  # left off when it was off before
    finally:
        gc.enable()
