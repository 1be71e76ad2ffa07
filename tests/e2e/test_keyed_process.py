"""KeyedProcess through real processes: a user's session logic (per-user state and an
event-time timer that closes a session once the watermark passes its gap) over Parquet
files, the container running it SIGKILLed twice at random moments; the sessions written
by the exactly-once sink are exactly Python's, each once."""

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
from tests.e2e.test_repartition import published_totals, repartition_when_ready
from tests.e2e.wordcount import words_of, write_wordcount_app
from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(420)

GAP_MS, USERS, FILES, ROWS_PER_FILE = 5_000, 50, 6, 4_000

APP = """
    import pyarrow as pa
    from weir.operators import Dag
    from weir.operators.library import FileSink, KeyedProcess, ParquetSource, ValueState

    GAP_MS = {gap}

    class Sessions(KeyedProcess):
        '''A user's session ends when no event came for GAP_MS of event time.'''

        STATE = {{"start": ValueState(pa.int64()), "last": ValueState(pa.int64()),
                  "total": ValueState(pa.int64()), "events": ValueState(pa.int64())}}
        OUTPUT = pa.schema([("user", pa.string()), ("start", pa.int64()),
                            ("end", pa.int64()), ("total", pa.int64()),
                            ("events", pa.int64())])

        def process_key(self, key, rows, ctx):
            s = ctx.state
            for ts, amount in zip(rows["ts"].to_pylist(), rows["amount"].to_pylist()):
                if s.last.value is not None and ts - s.last.value >= GAP_MS:
                    self.close(key, ctx)
                if s.last.value is None:
                    s.start.update(ts)
                    s.total.update(0)
                    s.events.update(0)
                else:
                    ctx.timers.delete_event_time(s.last.value + GAP_MS)
                s.last.update(ts)
                s.total.update(s.total.value + amount)
                s.events.update(s.events.value + 1)
                ctx.timers.event_time(ts + GAP_MS)

        def on_timer(self, key, timer, ctx):
            self.close(key, ctx)

        def close(self, key, ctx):
            s = ctx.state
            ctx.timers.delete_event_time(s.last.value + GAP_MS)
            ctx.emit(user=key, start=s.start.value, end=s.last.value,
                     total=s.total.value, events=s.events.value)
            for state in (s.start, s.last, s.total, s.events):
                state.clear()

    dag = Dag("keyed-sessions", CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=3000,
              CHECKPOINT_WINDOW_COUNT=4, STATE_DIR={state!r}, MAX_RESTARTS=8)
    source = dag.add_operator("source", ParquetSource({inbox!r}, rows_per_window=600,
                                                      batch_rows=300), CONTAINER=0,
                              EVENT_TIME_COLUMN="ts", WATERMARK_DELAY_MILLIS=0)
    sessions = dag.add_operator("sessions", Sessions(keys="user"), CONTAINER=1)
    sink = dag.add_operator("sink", FileSink({out!r}, exactly_once=True), CONTAINER=2)
    dag.add_stream("events", source.output, sessions.input)
    dag.add_stream("sessions", sessions.output, sink.input)
"""


def write_events(inbox: Path) -> collections.Counter:
    """Events in event-time order (so none is late), each user active in bursts; returns
    the reference sessions (user, start, end, total, events) as a multiset."""
    inbox.mkdir()
    rng = random.Random(7)
    ts = 1_790_000_000_000
    rows = []
    for _ in range(FILES * ROWS_PER_FILE):
        ts += rng.choice((1, 5, 20, 60))
        rows.append((f"u{rng.randrange(USERS) if rng.random() < 0.9 else rng.randrange(5)}",
                     ts, rng.randrange(100)))
    for f in range(FILES):
        part = rows[f * ROWS_PER_FILE:(f + 1) * ROWS_PER_FILE]
        table = pa.table({"user": [r[0] for r in part], "ts": [r[1] for r in part],
                          "amount": [r[2] for r in part]})
        pq.write_table(table, inbox / f".part-{f}.tmp")
        os.replace(inbox / f".part-{f}.tmp", inbox / f"part-{f}.parquet")
    sessions: collections.Counter = collections.Counter()
    by_user: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for user, t, amount in rows:
        by_user[user].append((t, amount))
    for user, events in by_user.items():
        start = last = events[0][0]
        total, count = 0, 0
        for t, amount in events:
            if t - last >= GAP_MS:
                sessions[(user, start, last, total, count)] += 1
                start, total, count = t, 0, 0
            last, total, count = t, total + amount, count + 1
        sessions[(user, start, last, total, count)] += 1
    return sessions


def test_keyed_sessions_with_timers_are_exact_after_sigkills_of_their_container(
        master, tmp_path):
    rng, note = chaos_seed()
    expected = write_events(tmp_path / "inbox")
    assert sum(expected.values()) > USERS  # several sessions per user: timers fire mid-run
    app = tmp_path / "keyed_app.py"
    app.write_text(textwrap.dedent(APP.format(
        gap=GAP_MS, state=str(tmp_path / "state"), inbox=str(tmp_path / "inbox"),
        out=str(tmp_path / "out"))))
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        kills = kill_operators_container(master, client, app_id, "sessions", rng, note,
                                         max_pause_s=2.0)
        wait_finished(client, master, app_id, timeout_s=240)
    assert kills >= 1, f"the run ended before a kill; {note}"
    rows = [json.loads(line) for file in sorted((tmp_path / "out").glob("*.jsonl"))
            for line in file.read_text().splitlines()]
    got = collections.Counter((r["user"], r["start"], r["end"], r["total"], r["events"])
                              for r in rows)
    assert got == expected, (
        f"{note}: {sum((got - expected).values())} sessions too many, e.g. "
        f"{list(got - expected)[:3]}; {sum((expected - got).values())} missing, e.g. "
        f"{list(expected - got)[:3]}")
    stores = list((tmp_path / "state").glob("runs/*/operators/*/keyed-process.sqlite"))
    assert len(stores) == 1, stores


WORD_TOTALS = '''
import pyarrow as pa
from weir.operators.library import KeyedProcess, ValueState


class WordTotals(KeyedProcess):
    STATE = {"count": ValueState(pa.int64())}
    OUTPUT = pa.schema([("word", pa.string()), ("count", pa.int64())])

    def process_key(self, key, rows, ctx):
        ctx.state.count.update((ctx.state.count.value or 0) + rows.num_rows)
        ctx.emit(word=key, count=ctx.state.count.value)
'''


def test_a_repartition_of_a_keyed_process_moves_every_keys_state(master, tmp_path):
    app, lines = write_wordcount_app(
        tmp_path, "keyed_repartition", 1_500,
        'CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=300, HEARTBEAT_INTERVAL_MILLIS=200, '
        'CHECKPOINT_WINDOW_COUNT=4, HEARTBEAT_TIMEOUT_MILLIS=5000',
        count='PARTITIONS=2, PARTITION_KEY="word"', lines_per_window=50, pinned=False)
    text = Path(app).read_text().replace('WindowedCount(key="word")', 'WordTotals(keys="word")')
    Path(app).write_text(WORD_TOTALS + text)
    out = tmp_path / "out"
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        poll_for(lambda: len(list(out.glob("*.jsonl"))) >= 2, 180,
                 "the sink to publish its first windows\n" + container_logs(master))
        repartition_when_ready(client, app_id, "count", 3)
        info = client.wait(app_id, 300)
        assert info.state == "FINISHED", f"{info.diagnostics}\n{container_logs(master)}"
        partitions = [op for op in client.operators(app_id) if op.logical_name == "count"
                      and not op.name.endswith("unifier")]
    assert info.repartitions == 1
    assert published_totals(out) == dict(collections.Counter(words_of(lines)))
    assert len(partitions) == 3 and all(op.total_tuples_processed > 0 for op in partitions)
