"""Tests of the buffer server and its client over a real Flight server on 127.0.0.1."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from weir.container.buffer_client import BufferServerUnavailable, Subscription, subscribe
from weir.container.buffer_server import LATEST_WINDOW, BufferServer, StreamStats
from weir.container.publisher import PublishAborted
from weir.container.retained_stream import Cursor, RetainedStream, SpillResult
from weir.container.spill import Budget, SpillStore, read_block
from weir.container.stream_messages import ENVELOPE_SCHEMA, Kind, Message, WindowGap

pytestmark = pytest.mark.timeout(60)

_WAIT_S = 10.0  # bound on every wait; generous, as the machine is shared
_STREAM = "3.output"


@pytest.fixture
def server() -> Iterator[BufferServer]:
    with BufferServer() as srv:
        yield srv


def _batch(window: int, n: int = 3) -> pa.RecordBatch:
    return pa.record_batch({"key": [f"w{window}-{i}" for i in range(n)],
                            "value": pa.array(range(window * 100, window * 100 + n), pa.int64())})


def _publish_window(pub, window: int, batches: int = 2) -> None:
    pub.begin_window(window)
    for i in range(batches):
        pub.data(window, _batch(window, i + 1))
    pub.end_window(window)


def _expected(windows: list[int], batches: int = 2) -> list[tuple[Kind, int]]:
    out = []
    for w in windows:
        out += [(Kind.BEGIN_WINDOW, w)] + [(Kind.DATA, w)] * batches + [(Kind.END_WINDOW, w)]
    return out


def _shape(messages: list[Message]) -> list[tuple[Kind, int]]:
    return [(m.kind, m.window_id) for m in messages]


def _collect(srv: BufferServer, stream: str = _STREAM, from_window: int = -1) -> list[Message]:
    host, port = srv.address
    return list(subscribe(host, port, stream, from_window, timeout_s=_WAIT_S))


class _Background:
    """Iterates a subscription in a thread, handing each message (or the error) to a queue."""

    def __init__(self, sub: Subscription) -> None:
        self.sub = sub
        self.items: queue.Queue[Message | BaseException | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for message in self.sub:
                self.items.put(message)
            self.items.put(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.items.put(exc)

    def next(self) -> Message | BaseException | None:
        return self.items.get(timeout=_WAIT_S)

    def take(self, count: int) -> list[Message]:
        out = []
        for _ in range(count):
            item = self.next()
            assert isinstance(item, Message), item
            out.append(item)
        return out


def _take(stream: RetainedStream, cursor: Cursor, max_bytes: int = 1 << 20) -> list[Message]:
    """Everything ``cursor`` can read now, loading spilled blocks as the server does."""
    out: list[Message] = []
    loaded: dict = {}
    while True:
        with stream.cond:
            messages, needed = stream.take(cursor, max_bytes, loaded)
        if needed is not None:
            loaded = {needed: read_block(needed.path)}
        elif not messages:
            return out
        out += messages


def _wait_for(predicate, what: str) -> None:
    event = threading.Event()
    for _ in range(int(_WAIT_S / 0.02)):
        if predicate():
            return
        event.wait(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_late_subscriber_gets_everything_in_order(server):
    pub = server.publisher(_STREAM)
    for w in (1, 2, 3):
        _publish_window(pub, w)
    pub.end_stream()
    messages = _collect(server)
    assert _shape(messages) == _expected([1, 2, 3]) + [(Kind.END_STREAM, 3)]
    data = [m.batch() for m in messages if m.kind == Kind.DATA]
    assert data == [_batch(w, i + 1) for w in (1, 2, 3) for i in range(2)]
    assert pub.messages_published == len(messages)
    assert pub.bytes_published == sum(m.nbytes for m in messages) > 0


def test_early_subscriber_receives_messages_as_published(server):
    host, port = server.address
    bg = _Background(Subscription(host, port, _STREAM, timeout_s=_WAIT_S * 2))
    _wait_for(lambda: server.subscribers == 1, "the subscription")  # before the publisher
    pub = server.publisher(_STREAM)
    pub.begin_window(1)
    assert _shape(bg.take(1)) == [(Kind.BEGIN_WINDOW, 1)]
    pub.data(1, _batch(1))
    (message,) = bg.take(1)
    assert message.batch() == _batch(1)
    pub.end_window(1)
    _publish_window(pub, 2)
    pub.end_stream()
    assert _shape(bg.take(5)) == [(Kind.END_WINDOW, 1)] + _expected([2])
    assert _shape(bg.take(1)) == [(Kind.END_STREAM, 2)]
    assert bg.next() is None
    bg.thread.join(_WAIT_S)
    assert not bg.thread.is_alive()


def test_from_window_replays_from_an_older_window(server):
    pub = server.publisher(_STREAM)
    for w in (1, 2, 3, 4):
        _publish_window(pub, w)
    host, port = server.address
    replay = _Background(Subscription(host, port, _STREAM, from_window=2, timeout_s=_WAIT_S))
    assert _shape(replay.take(8)) == _expected([3, 4])
    ahead = _Background(Subscription(host, port, _STREAM, from_window=5, timeout_s=_WAIT_S))
    _wait_for(lambda: server.subscribers == 2, "both subscriptions")
    for w in (5, 6):
        _publish_window(pub, w)
    pub.end_stream()
    assert _shape(replay.take(9)) == _expected([5, 6]) + [(Kind.END_STREAM, 6)]
    # windows <= from_window published after subscribing are skipped too
    assert _shape(ahead.take(5)) == _expected([6]) + [(Kind.END_STREAM, 6)]
    assert replay.next() is None and ahead.next() is None


def test_from_window_past_the_end_still_gets_end_stream(server):
    pub = server.publisher(_STREAM)
    _publish_window(pub, 1)
    pub.end_stream()
    assert _shape(_collect(server, from_window=7)) == [(Kind.END_STREAM, 1)]


def test_purge_some_then_all(server):
    pub = server.publisher(_STREAM)
    for w in (1, 2, 3):
        _publish_window(pub, w)
    retained = server.stream_stats()[_STREAM]
    assert retained == StreamStats(12, pub.bytes_published, 0)
    server.purge(_STREAM, 2)
    messages, nbytes, on_disk = server.stream_stats()[_STREAM]
    assert messages == 4 and 0 < nbytes < retained.memory_bytes and on_disk == 0
    pub.end_stream()
    assert _shape(_collect(server, from_window=2)) == _expected([3]) + [(Kind.END_STREAM, 3)]
    server.purge(_STREAM, 3)
    assert server.stream_stats()[_STREAM] == (1, 0, 0)  # END_STREAM stays for late readers
    assert _shape(_collect(server, from_window=3)) == [(Kind.END_STREAM, 3)]
    server.purge("no.such", 3)  # unknown streams are ignored


def test_purge_all_before_end_and_live_subscriber_continues(server):
    pub = server.publisher(_STREAM)
    _publish_window(pub, 1)
    host, port = server.address
    bg = _Background(Subscription(host, port, _STREAM, timeout_s=_WAIT_S))
    assert _shape(bg.take(4)) == _expected([1])
    server.purge(_STREAM, 1)
    assert server.stream_stats()[_STREAM] == (0, 0, 0)
    _publish_window(pub, 2)
    pub.end_stream()
    assert _shape(bg.take(5)) == _expected([2]) + [(Kind.END_STREAM, 2)]
    assert bg.next() is None


def test_storage_positions_survive_purge_and_rewind():
    stream = RetainedStream("s")
    for w in (1, 2, 3):
        for kind in (Kind.BEGIN_WINDOW, Kind.END_WINDOW):
            stream.append(Message(kind, w))
    slow, fast = Cursor(-1), Cursor(-1)
    assert _shape(_take(stream, slow)[:1]) == [(Kind.BEGIN_WINDOW, 1)]
    slow.seq = 1  # as if it had read only BEGIN_WINDOW(1)
    assert len(_take(stream, fast)) == 6
    assert stream.purge(2) == 4
    # the slow reader's next message was purged: it continues at the first retained one
    assert _shape(_take(stream, slow)) == [(Kind.BEGIN_WINDOW, 3), (Kind.END_WINDOW, 3)]
    assert stream.rewind(2) == 2  # window 3 is dropped and republished
    for w in (3, 4):
        stream.append(Message(Kind.BEGIN_WINDOW, w))
    assert _shape(_take(stream, fast)) == [(Kind.BEGIN_WINDOW, 3), (Kind.BEGIN_WINDOW, 4)]
    assert _shape(_take(stream, slow)) == [(Kind.BEGIN_WINDOW, 3), (Kind.BEGIN_WINDOW, 4)]
    assert _take(stream, fast) == []


def test_two_subscribers_on_one_stream(server):
    host, port = server.address
    first = _Background(Subscription(host, port, _STREAM, timeout_s=_WAIT_S))
    second = _Background(Subscription(host, port, _STREAM, timeout_s=_WAIT_S))
    _wait_for(lambda: server.subscribers == 2, "both subscriptions")
    pub = server.publisher(_STREAM)
    for w in (1, 2):
        _publish_window(pub, w)
    pub.end_stream()
    want = _expected([1, 2]) + [(Kind.END_STREAM, 2)]
    got_first, got_second = first.take(len(want)), second.take(len(want))
    assert _shape(got_first) == _shape(got_second) == want
    assert [m.payload for m in got_first] == [m.payload for m in got_second]
    assert first.next() is None and second.next() is None
    _wait_for(lambda: server.subscribers == 0, "the subscriptions to end")


def test_end_stream_ends_the_iterator_and_the_stream(server):
    pub = server.publisher(_STREAM)
    pub.begin_window(1)
    pub.end_window(1)
    pub.end_stream()
    host, port = server.address
    sub = Subscription(host, port, _STREAM, timeout_s=_WAIT_S)
    assert _shape(list(sub)) == [(Kind.BEGIN_WINDOW, 1), (Kind.END_WINDOW, 1),
                                 (Kind.END_STREAM, 1)]
    assert sub.messages_received == 3
    with pytest.raises(ValueError, match="after END_STREAM"):
        pub.begin_window(2)
    with pytest.raises(RuntimeError, match="only once"):
        iter(sub)


def test_windows_must_not_go_back(server):
    pub = server.publisher(_STREAM)
    _publish_window(pub, 5)
    with pytest.raises(ValueError, match="must not go back"):
        pub.begin_window(4)


def test_restarted_publisher_rewinds_to_its_checkpoint(server):
    pub = server.publisher(_STREAM)
    for w in (1, 2):
        _publish_window(pub, w)
    host, port = server.address
    live = _Background(Subscription(host, port, _STREAM, from_window=1, timeout_s=_WAIT_S))
    assert _shape(live.take(4)) == _expected([2])
    restarted = server.publisher(_STREAM, from_window=1)
    assert server.stream_stats()[_STREAM][0] == 4
    for w in (2, 3):
        _publish_window(restarted, w, batches=1)
    restarted.end_stream()
    # the live subscriber had read window 2 before the rewind; it gets the republished one
    assert _shape(live.take(7)) == _expected([2, 3], batches=1) + [(Kind.END_STREAM, 3)]
    assert live.next() is None
    assert _shape(_collect(server)) == (_expected([1]) + _expected([2, 3], batches=1)
                                        + [(Kind.END_STREAM, 3)])
    again = server.publisher(_STREAM, from_window=3)  # rewinding past the end drops only
    assert server.stream_stats()[_STREAM][0] == 10    # END_STREAM
    again.end_stream()


def test_close_while_a_subscriber_waits_ends_it(server):
    host, port = server.address
    sub = Subscription(host, port, _STREAM)  # no deadline: only close() can end it
    bg = _Background(sub)
    pub = server.publisher(_STREAM)
    pub.begin_window(1)
    assert _shape(bg.take(1)) == [(Kind.BEGIN_WINDOW, 1)]
    closer = threading.Thread(target=server.close, daemon=True)
    closer.start()
    closer.join(_WAIT_S)
    assert not closer.is_alive(), "close() hung with a subscriber waiting"
    assert isinstance(bg.next(), BufferServerUnavailable)
    bg.thread.join(_WAIT_S)
    assert not bg.thread.is_alive()
    server.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        server.start()


def test_close_with_a_subscriber_that_stopped_reading():
    srv = BufferServer().start()
    pub = srv.publisher(_STREAM)
    big = pa.record_batch({"value": pa.array(range(1 << 20), pa.int64())})  # 8 MB
    for w in range(12):
        pub.begin_window(w)
        pub.data(w, big)
        pub.end_window(w)
    host, port = srv.address
    messages = subscribe(host, port, _STREAM, timeout_s=_WAIT_S * 3)
    assert next(messages).kind == Kind.BEGIN_WINDOW  # then never read again
    closer = threading.Thread(target=srv.close, daemon=True)
    closer.start()
    closer.join(_WAIT_S)
    assert not closer.is_alive(), "close() hung on a subscriber that stopped reading"
    with pytest.raises(BufferServerUnavailable):  # no new calls are accepted
        next(subscribe(host, port, _STREAM, timeout_s=_WAIT_S))
    messages.close()  # cancels the call: the server drops it
    _wait_for(lambda: srv.subscribers == 0, "the stalled subscription to end")


def test_subscription_close_from_another_thread(server):
    host, port = server.address
    sub = Subscription(host, port, _STREAM)
    bg = _Background(sub)
    _wait_for(lambda: server.subscribers == 1, "the subscription")
    sub.close()
    assert bg.next() is None  # ends quietly, no error
    _wait_for(lambda: server.subscribers == 0, "the server to drop the subscription")
    assert sub.closed
    closed_first = Subscription(host, port, _STREAM)
    closed_first.close()
    assert list(closed_first) == []


def test_batch_round_trips_with_schema_and_values(server):
    schema = pa.schema(
        [("key", pa.string()), ("n", pa.int64()), ("x", pa.float64()),
         ("ts", pa.timestamp("us", tz="UTC")), ("tags", pa.list_(pa.string())),
         ("cat", pa.dictionary(pa.int32(), pa.string())), ("blob", pa.binary())],
        metadata={b"origin": b"test"})
    batch = pa.record_batch(
        [pa.array(["a", None, "ü€"]), pa.array([1, -(2**63), 2**63 - 1], pa.int64()),
         pa.array([0.5, None, float("inf")]), pa.array([0, 1, None], pa.timestamp("us", "UTC")),
         pa.array([["x"], [], None], pa.list_(pa.string())),
         pa.array(["p", "q", "p"]).dictionary_encode(), pa.array([b"\x00\xff", b"", None])],
        schema=schema)
    pub = server.publisher(_STREAM)
    pub.data(1, batch)
    pub.end_stream()
    data, end = _collect(server)
    assert end.kind == Kind.END_STREAM
    assert data.kind == Kind.DATA and data.rows == 3
    got = data.batch()
    assert got.schema.equals(schema, check_metadata=True)
    assert got.equals(batch)


def test_envelopes_are_capped_but_a_big_message_goes_alone():
    with BufferServer(max_envelope_bytes=4096) as srv:
        pub = srv.publisher(_STREAM)
        small = pa.record_batch({"v": pa.array(range(100), pa.int64())})  # ~1 kB encoded
        big = pa.record_batch({"v": pa.array(range(2000), pa.int64())})  # ~16 kB encoded
        for w in range(8):
            pub.data(w, small)
        pub.data(8, big)
        pub.end_stream()
        host, port = srv.address
        sub = Subscription(host, port, _STREAM, timeout_s=_WAIT_S)
        messages = list(sub)
    assert [m.batch() for m in messages[:-1]] == [small] * 8 + [big]
    assert 2 < sub.envelopes_received < len(messages)
    assert sub.bytes_received == pub.bytes_published


def test_unknown_server_gives_buffer_server_unavailable():
    srv = BufferServer().start()
    host, port = srv.address
    srv.close()  # the port is now closed
    with pytest.raises(BufferServerUnavailable, match=f"buffer server {host}:{port}"):
        next(subscribe(host, port, _STREAM, timeout_s=_WAIT_S))


def test_timeout_bounds_a_subscription(server):
    host, port = server.address
    with pytest.raises(TimeoutError, match=_STREAM):
        list(subscribe(host, port, _STREAM, timeout_s=0.3))


def test_bad_ticket_is_rejected(server):
    import pyarrow.flight as flight

    host, port = server.address
    client = flight.FlightClient(f"grpc+tcp://{host}:{port}")
    try:
        with pytest.raises(flight.FlightError, match="bad buffer-server ticket"):
            client.do_get(flight.Ticket(b'{"stream": 3}')).read_all()
    finally:
        client.close()


def test_two_million_rows_go_through(server):
    rows, batch_rows = 2_000_000, 64 * 1024
    ids = pa.array(range(rows), pa.int64())
    keys = pc.binary_join_element_wise("key-", pc.cast(pc.bit_wise_and(ids, 4095), pa.string()),
                                       "")
    table = pa.table({"key": keys, "value": ids})
    host, port = server.address
    sub = Subscription(host, port, _STREAM, timeout_s=120)
    received: list[pa.RecordBatch] = []
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            received.extend(m.batch() for m in sub if m.kind == Kind.DATA)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    pub = server.publisher(_STREAM)
    for w, batch in enumerate(table.to_batches(max_chunksize=batch_rows)):
        if w % 4 == 0:
            pub.begin_window(w // 4)
        pub.data(w // 4, batch)
        if w % 4 == 3:
            pub.end_window(w // 4)
    pub.end_stream()
    consumer.join(120)
    assert not consumer.is_alive() and not errors, errors
    assert len(received) == -(-rows // batch_rows)
    assert pa.Table.from_batches(received).equals(table)
    assert sub.bytes_received == pub.bytes_published


# -- retention, spill and back-pressure ------------------------------------------------

_ROWS = 1000  # one batch: 1000 int64 values, about 8.3 kB of payload


def _numbers(window: int, index: int, offset: int = 0) -> pa.RecordBatch:
    start = offset + window * 10_000 + index * _ROWS
    return pa.record_batch({"value": pa.array(range(start, start + _ROWS), pa.int64())})


def _publish_numbers(pub, windows, batches: int = 2, offset: int = 0) -> None:
    for w in windows:
        pub.begin_window(w)
        for i in range(batches):
            pub.data(w, _numbers(w, i, offset))
        pub.end_window(w)


def _check_numbers(messages: list[Message], windows, batches: int = 2,
                   offset: int = 0) -> None:
    """``messages`` are exactly ``windows`` (with these values), in order."""
    assert _shape(messages) == _expected(list(windows), batches)
    data = [m.batch() for m in messages if m.kind == Kind.DATA]
    assert data == [_numbers(w, i, offset) for w in windows for i in range(batches)]


def _spill_files(root) -> list:
    return sorted(root.rglob("*.arrow"))


def _windows_in(path) -> list[int]:
    return [m.window_id for m in read_block(path)]


@pytest.fixture
def spilling(tmp_path) -> Iterator[BufferServer]:
    """A server keeping about 64 kB in memory (8 batches) in 24 kB blocks."""
    with BufferServer(memory_budget_bytes=64_000, disk_budget_bytes=10_000_000,
                      block_bytes=24_000, spill_dir=tmp_path) as srv:
        yield srv


def test_spill_to_disk_and_read_back_in_order(spilling, tmp_path):
    pub = spilling.publisher(_STREAM)
    _publish_numbers(pub, range(30))
    stats = spilling.stats()
    assert 0 < stats.memory_bytes <= 64_000
    assert stats.disk_bytes > 0 and stats.blocks_on_disk >= 10
    assert stats.memory_bytes + stats.disk_bytes == pub.bytes_published
    assert spilling.stream_stats()[_STREAM] == (120, stats.memory_bytes, stats.disk_bytes)
    assert stats.blocks_spilled == stats.blocks_on_disk and stats.publisher_waits == 0
    files = _spill_files(tmp_path)
    assert len(files) == stats.blocks_on_disk
    assert all(f.parent == spilling.spill_path for f in files)
    assert pa.ipc.open_file(pa.memory_map(str(files[0]))).schema.equals(ENVELOPE_SCHEMA)
    pub.end_stream()
    messages = _collect(spilling)  # a late subscriber: the whole stream, from disk first
    assert messages[-1].kind == Kind.END_STREAM
    _check_numbers(messages[:-1], range(30))
    assert spilling.stats().blocks_read >= stats.blocks_on_disk
    spilling.close()
    assert spilling.spill_path is None and list(tmp_path.iterdir()) == []


def test_replay_from_a_spilled_window(spilling):
    pub = spilling.publisher(_STREAM)
    _publish_numbers(pub, range(30))
    pub.end_stream()
    assert spilling.stats().disk_bytes > 0
    for from_window in (4, 17, 27):  # the first two are on disk, the last in memory
        messages = _collect(spilling, from_window=from_window)
        assert messages[-1].kind == Kind.END_STREAM
        _check_numbers(messages[:-1], range(from_window + 1, 30))


def test_live_subscriber_while_the_stream_spills(spilling):
    host, port = spilling.address
    bg = _Background(Subscription(host, port, _STREAM, timeout_s=_WAIT_S * 3))
    _wait_for(lambda: spilling.subscribers == 1, "the subscription")
    pub = spilling.publisher(_STREAM)
    _publish_numbers(pub, range(40))
    pub.end_stream()
    messages = bg.take(40 * 4 + 1)
    _check_numbers(messages[:-1], range(40))
    assert messages[-1].kind == Kind.END_STREAM and bg.next() is None
    assert spilling.stats().blocks_spilled > 0


def test_purge_drops_spilled_blocks_some_then_all(spilling, tmp_path):
    pub = spilling.publisher(_STREAM)
    _publish_numbers(pub, range(30))
    before = spilling.stats()
    last_window = {path: max(_windows_in(path)) for path in _spill_files(tmp_path)}
    spilling.purge(_STREAM, 9)
    after = spilling.stats()
    assert after.messages == 20 * 4
    assert 0 < after.disk_bytes < before.disk_bytes
    assert after.memory_bytes == before.memory_bytes
    # exactly the blocks wholly at or before window 9 are deleted
    assert _spill_files(tmp_path) == [p for p, w in last_window.items() if w > 9]
    assert 0 < after.blocks_on_disk < len(last_window)
    pub.end_stream()
    messages = _collect(spilling, from_window=9)
    _check_numbers(messages[:-1], range(10, 30))
    spilling.purge(_STREAM, 29)
    assert spilling.stream_stats()[_STREAM] == (1, 0, 0)  # END_STREAM
    assert _spill_files(tmp_path) == [] and spilling.stats().blocks_on_disk == 0
    assert _shape(_collect(spilling, from_window=29)) == [(Kind.END_STREAM, 29)]


def test_purge_all_purges_every_stream(spilling, tmp_path):
    pubs = [spilling.publisher(f"{i}.output") for i in range(3)]
    for w in range(8):
        for pub in pubs:
            _publish_numbers(pub, [w])
    stats = spilling.stats()
    per_stream = spilling.stream_stats()
    assert stats.streams == 3 and stats.messages == 3 * 8 * 4
    assert stats.memory_bytes == sum(s.memory_bytes for s in per_stream.values())
    assert stats.disk_bytes == sum(s.disk_bytes for s in per_stream.values()) > 0
    spilling.purge_all(5)
    assert all(s.messages == 2 * 4 for s in spilling.stream_stats().values())
    spilling.purge_all(7)
    assert spilling.stream_stats() == {f"{i}.output": (0, 0, 0) for i in range(3)}
    assert _spill_files(tmp_path) == []
    stats = spilling.stats()
    assert (stats.messages, stats.memory_bytes, stats.disk_bytes) == (0, 0, 0)


def test_rewind_into_spilled_windows(spilling, tmp_path):
    pub = spilling.publisher(_STREAM)
    _publish_numbers(pub, range(30))
    host, port = spilling.address
    live = _Background(Subscription(host, port, _STREAM, timeout_s=_WAIT_S * 2))
    _check_numbers(live.take(120), range(30))
    restarted = spilling.publisher(_STREAM, from_window=5)
    assert spilling.stream_stats()[_STREAM].messages == 6 * 4
    assert all(min(_windows_in(path)) <= 5 for path in _spill_files(tmp_path))
    _publish_numbers(restarted, range(6, 20), batches=1, offset=500_000)
    restarted.end_stream()
    # the live subscriber had read windows 6-29; it gets the republished ones
    messages = live.take(14 * 3 + 1)
    _check_numbers(messages[:-1], range(6, 20), batches=1, offset=500_000)
    assert messages[-1].kind == Kind.END_STREAM and live.next() is None
    messages = _collect(spilling)
    _check_numbers(messages[:24], range(6))
    _check_numbers(messages[24:-1], range(6, 20), batches=1, offset=500_000)
    # a spill file cut by the rewind stays whole until purged: at most one block more
    stats = spilling.stats()
    retained = pub.bytes_published * 6 // 30 + restarted.bytes_published
    assert 0 <= stats.memory_bytes + stats.disk_bytes - retained < 24_000 + 8_400


def test_storage_reads_spilled_blocks_at_any_position(tmp_path):
    store = SpillStore(tmp_path)
    stream = RetainedStream("s", 0, Budget(1 << 30, 1 << 30), store, block_bytes=20_000)
    for w in range(1, 7):
        for kind in (Kind.BEGIN_WINDOW, Kind.DATA, Kind.DATA, Kind.END_WINDOW):
            i = 0 if kind != Kind.DATA else 1
            stream.append(Message.data(w, _numbers(w, i)) if kind == Kind.DATA
                          else Message(kind, w))
    everything = list(stream.messages)
    slow, fast = Cursor(-1), Cursor(-1)
    assert len(_take(stream, fast)) == 24
    spills = 0
    while stream.spill() is SpillResult.SPILLED:
        spills += 1
    assert spills == len(stream.blocks) >= 3 and stream.memory_bytes == 0
    assert stream.messages == [everything[-1]]  # a zero-byte END_WINDOW is not worth a file
    slow.seq = 5  # as if it had read window 1 and BEGIN_WINDOW(2) before the spill
    with stream.cond:
        first, needed = stream.take(slow, 1 << 20)
    assert first == [] and needed is stream.blocks[0]  # the reader must load the block
    assert _take(stream, slow) == everything[5:]
    assert _shape(_take(stream, Cursor(3))) == _shape(everything[12:])
    assert stream.purge(2) == 8
    assert all(max(_windows_in(path)) > 2 for path in _spill_files(tmp_path))
    assert _take(stream, Cursor(2)) == everything[8:]
    assert stream.rewind(4) == 8  # windows 5 and 6, on disk and in memory
    stream.append(Message(Kind.BEGIN_WINDOW, 5))
    assert _shape(_take(stream, fast)) == [(Kind.BEGIN_WINDOW, 5)]
    assert _shape(_take(stream, slow)) == [(Kind.BEGIN_WINDOW, 5)]
    assert _take(stream, Cursor(2)) == everything[8:16] + [stream.messages[-1]]
    store.close()
    assert list(tmp_path.iterdir()) == []


def test_default_spill_folder_is_temporary_and_removed_at_close():
    with BufferServer(memory_budget_bytes=20_000) as srv:
        pub = srv.publisher(_STREAM)
        assert srv.spill_path is None  # made on the first spill only
        _publish_numbers(pub, range(6))
        folder = srv.spill_path
        assert folder is not None and folder.is_dir() and any(folder.iterdir())
    assert not folder.exists()


def _publish_in_thread(pub, windows, batches: int = 1) -> tuple[threading.Thread, list]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _publish_numbers(pub, windows, batches)
            pub.end_stream()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_back_pressure_waits_for_purge_and_loses_nothing(tmp_path):
    with BufferServer(memory_budget_bytes=32_000, disk_budget_bytes=64_000,
                      block_bytes=16_000, spill_dir=tmp_path) as srv:
        pub = srv.publisher(_STREAM)
        windows = range(40)  # about 330 kB, three times what memory and disk hold
        publisher, errors = _publish_in_thread(pub, windows)
        _wait_for(lambda: srv.stats().publishers_waiting == 1, "the publisher to block")
        stats = srv.stats()
        assert publisher.is_alive() and not errors
        assert pub.messages_published < len(windows) * 3
        assert stats.memory_bytes <= 32_000 and 0 < stats.disk_bytes <= 64_000
        host, port = srv.address
        bg = _Background(Subscription(host, port, _STREAM, timeout_s=_WAIT_S * 3))
        received: list[Message] = []
        while True:  # read, and purge each window read, as the committed window would
            item = bg.next()
            assert isinstance(item, Message), item
            received.append(item)
            if item.kind == Kind.END_WINDOW:
                srv.purge(_STREAM, item.window_id)
            if item.kind == Kind.END_STREAM:
                break
        assert bg.next() is None
        publisher.join(_WAIT_S)
        assert not publisher.is_alive() and not errors, errors
        _check_numbers(received[:-1], windows, batches=1)
        assert pub.waits >= 1 and pub.wait_s > 0
        stats = srv.stats()
        assert stats.publisher_waits >= pub.waits and stats.publishers_waiting == 0
        assert srv.publisher_wait_s == stats.publisher_wait_s >= pub.wait_s
        assert stats.blocks_spilled > 0


def test_without_disk_budget_the_publisher_waits_at_the_memory_budget():
    with BufferServer(memory_budget_bytes=20_000, disk_budget_bytes=0) as srv:
        pub = srv.publisher(_STREAM)
        publisher, errors = _publish_in_thread(pub, range(6))
        _wait_for(lambda: srv.stats().publishers_waiting == 1, "the publisher to block")
        assert srv.stats().disk_bytes == 0 and srv.spill_path is None
        # windows 0 and 1 (two batches, 16.6 kB) and BEGIN_WINDOW(2): no room for a third
        assert srv.stream_stats()[_STREAM] == (7, pub.bytes_published, 0)
        srv.purge(_STREAM, 0)
        _wait_for(lambda: pub.messages_published > 7, "the publisher to go on after a purge")
        _wait_for(lambda: srv.purge_all(10) or not publisher.is_alive(),
                  "the publisher to finish as purges free room")
        assert not errors, errors
        assert pub.waits >= 1 and srv.stats().publisher_waits == pub.waits
        srv.purge_all(10)
        assert srv.stream_stats()[_STREAM] == (1, 0, 0)


def test_a_waiting_publisher_stops_on_its_stop_event_or_close():
    srv = BufferServer(memory_budget_bytes=20_000, disk_budget_bytes=0).start()
    try:
        stop = threading.Event()
        first = srv.publisher("1.output", stop=stop)
        second = srv.publisher("2.output")
        t1, errors1 = _publish_in_thread(first, range(5))
        _wait_for(lambda: srv.stats().publishers_waiting == 1, "the first to block")
        t2, errors2 = _publish_in_thread(second, range(5))
        _wait_for(lambda: srv.stats().publishers_waiting == 2, "the second to block")
        stop.set()
        t1.join(_WAIT_S)
        assert not t1.is_alive() and isinstance(errors1[0], PublishAborted), errors1
        assert t2.is_alive()
        retained = srv.stream_stats()
    finally:
        srv.close()
    t2.join(_WAIT_S)
    assert not t2.is_alive() and isinstance(errors2[0], PublishAborted), errors2
    assert "closed" in str(errors2[0])
    assert srv.stream_stats() == retained  # the aborted messages were not stored
    assert srv.stats().publishers_waiting == 0


def test_suspended_stream_serves_nothing_until_its_publisher_rewinds():
    with BufferServer() as server:
        host, port = server.address
        pub = server.publisher("s")
        for w in (1, 2):
            pub.begin_window(w)
            pub.data(w, pa.record_batch({"x": [w]}))
            pub.end_window(w)
        pub.begin_window(3)  # the old instance stops inside window 3
        server.suspend("s")
        received: list[Message] = []
        sub = Subscription(host, port, "s", from_window=1)
        reader = threading.Thread(target=lambda: received.extend(sub), daemon=True)
        reader.start()
        _wait_for(lambda: server.idle_subscribers("s") == 1, "the subscriber to wait")
        assert received == [], "a suspended stream must not serve stale windows"
        new = server.publisher("s", from_window=1)  # the successor, from checkpoint 1
        for w in (2, 3):
            new.begin_window(w)
            new.data(w, pa.record_batch({"x": [10 * w]}))
            new.end_window(w)
        new.end_stream()
        reader.join(10)
        assert not reader.is_alive()
        kinds = [(m.kind.name, m.window_id) for m in received]
        assert kinds == [("BEGIN_WINDOW", 2), ("DATA", 2), ("END_WINDOW", 2),
                         ("BEGIN_WINDOW", 3), ("DATA", 3), ("END_WINDOW", 3),
                         ("END_STREAM", kinds[-1][1])]
        assert [m.batch().column(0).to_pylist() for m in received if m.kind == Kind.DATA] \
            == [[20], [30]]


def test_latest_window_subscriber_gets_only_windows_begun_after_it_joined():

    with BufferServer() as server:
        host, port = server.address
        pub = server.publisher("s")
        for w in (1, 2):
            pub.begin_window(w)
            pub.data(w, pa.record_batch({"x": [w]}))
            pub.end_window(w)
        pub.begin_window(3)  # in progress when the subscriber joins: not for it
        pub.data(3, pa.record_batch({"x": [3]}))
        received: list[Message] = []
        sub = Subscription(host, port, "s", from_window=LATEST_WINDOW)
        reader = threading.Thread(target=lambda: received.extend(sub), daemon=True)
        reader.start()
        _wait_for(lambda: server.idle_subscribers("s") == 1, "the subscriber to be placed")
        pub.end_window(3)
        pub.begin_window(4)
        pub.data(4, pa.record_batch({"x": [4]}))
        pub.end_window(4)
        pub.end_stream()
        reader.join(10)
        assert [(m.kind.name, m.window_id) for m in received][:3] == [
            ("BEGIN_WINDOW", 4), ("DATA", 4), ("END_WINDOW", 4)]
        assert [m.batch().column(0).to_pylist() for m in received if m.kind == Kind.DATA] \
            == [[4]]


# -- gaps: a stream that does not hold what a subscriber asks for fails it, loudly ---------
def test_a_stream_restarted_after_a_checkpoint_refuses_a_subscriber_from_before_it(server):
    pub = server.publisher(_STREAM, from_window=5)  # a new container, from checkpoint 5
    for w in (6, 7):
        _publish_window(pub, w)
    with pytest.raises(WindowGap, match=r"stream '3.output' holds only the windows after 0:5, "
                                        r"but the subscriber needs every window after 0:2"):
        _collect(server, from_window=2)
    pub.end_stream()
    assert _shape(_collect(server, from_window=5)) == _expected([6, 7]) + [(Kind.END_STREAM, 7)]
    assert _shape(_collect(server, from_window=6)) == _expected([7]) + [(Kind.END_STREAM, 7)]


def test_a_subscriber_waiting_before_its_publisher_fails_if_the_stream_starts_later(server):
    host, port = server.address
    bg = _Background(Subscription(host, port, _STREAM, timeout_s=_WAIT_S))
    _wait_for(lambda: server.subscribers == 1, "the subscription")
    pub = server.publisher(_STREAM, from_window=63)
    _publish_window(pub, 64)
    error = bg.next()
    assert isinstance(error, WindowGap), error
    assert "holds only the windows after 0:63, but the subscriber needs every window from " \
           "the stream's start" in str(error)


def test_purged_windows_are_a_gap_for_a_subscriber_that_needs_them(server):
    pub = server.publisher(_STREAM)
    for w in (1, 2, 3):
        _publish_window(pub, w)
    server.purge(_STREAM, 2)
    with pytest.raises(WindowGap, match="after 0:2, but the subscriber needs every window "
                                        "after 0:1"):
        _collect(server, from_window=1)
    pub.end_stream()
    assert _shape(_collect(server, from_window=2)) == _expected([3]) + [(Kind.END_STREAM, 3)]


def test_a_publisher_restarted_in_the_same_stream_keeps_what_it_holds(server):
    pub = server.publisher(_STREAM)
    for w in (1, 2, 3):
        _publish_window(pub, w)
    pub = server.publisher(_STREAM, from_window=2)  # undeployed, redeployed here from 2
    _publish_window(pub, 3)
    pub.end_stream()
    assert _shape(_collect(server)) == _expected([1, 2, 3]) + [(Kind.END_STREAM, 3)]


def test_a_latest_window_subscriber_skips_by_its_promise(server):
    pub = server.publisher(_STREAM, from_window=5)  # an empty stream that starts after 5
    host, port = server.address
    bg = _Background(Subscription(host, port, _STREAM, from_window=LATEST_WINDOW,
                                  timeout_s=_WAIT_S))
    # placed on the empty stream: "after window -1"
    _wait_for(lambda: server.idle_subscribers(_STREAM) == 1, "the subscription placed")
    _publish_window(pub, 6)
    pub.end_stream()
    assert _shape(bg.take(5)) == _expected([6]) + [(Kind.END_STREAM, 6)]


def test_a_latest_subscriber_never_takes_a_window_at_or_before_its_own(server):
    """An AT_MOST_ONCE reader restarted from checkpoint 3 subscribes to an upstream that
    restarted from 1: what the upstream republishes up to 3 was processed already."""
    pub = server.publisher(_STREAM, from_window=1)
    host, port = server.address
    bg = _Background(Subscription(host, port, _STREAM, from_window=3, latest=True,
                                  timeout_s=_WAIT_S))
    _wait_for(lambda: server.subscribers == 1, "the subscription")
    for w in (2, 3, 4):
        _publish_window(pub, w)
    pub.end_stream()
    assert _shape(bg.take(5)) == _expected([4]) + [(Kind.END_STREAM, 4)]


# -- generations: a subscriber reads the deployment it was told of, and only that one -----
def test_a_subscriber_waits_for_the_generation_it_reads_and_an_older_publisher_is_refused(
        server):
    old = server.publisher(_STREAM, generation=1)
    _publish_window(old, 1)
    host, port = server.address
    bg = _Background(Subscription(host, port, _STREAM, from_window=1, generation=2,
                                  timeout_s=_WAIT_S))
    _wait_for(lambda: server.subscribers == 1, "the subscription")
    _publish_window(old, 2)  # the replaced deployment's window: not for this subscriber
    _wait_for(lambda: server.idle_subscribers(_STREAM) == 1, "the subscriber to wait")
    assert bg.items.empty()
    new = server.publisher(_STREAM, from_window=1, generation=2)
    with pytest.raises(PublishAborted, match="generation 1 of its publisher was replaced by "
                                             "generation 2"):
        old.begin_window(3)
    with pytest.raises(PublishAborted, match="generation 1 cannot publish"):
        server.publisher(_STREAM, generation=1)
    _publish_window(new, 2)
    new.end_stream()
    assert _shape(bg.take(5)) == _expected([2]) + [(Kind.END_STREAM, 2)]


def test_spill_folders_of_killed_containers_are_swept_by_the_next_one(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(10)
    orphan = tmp_path / f"weir-spill-{gone.pid}-x1y2"
    orphan.mkdir()
    (orphan / "0.output-00000000.arrow").write_bytes(b"a block nobody will read")
    alive = tmp_path / f"weir-spill-{os.getppid()}-a1b2"  # another container, still running
    alive.mkdir()
    store = SpillStore(tmp_path)
    try:
        store.write("0.output", [Message(Kind.BEGIN_WINDOW, 1)])
        assert not orphan.exists() and alive.exists()
        assert store.path.name.startswith(f"weir-spill-{os.getpid()}-")
    finally:
        store.close()


def test_a_stopped_operators_publisher_publishes_nothing_more():
    """Issue 17, item 6: once its operator is stopped (undeployed), a thread that is still
    running cannot append to the stream its replacement will rewind."""
    stop = threading.Event()
    with BufferServer() as server:
        publisher = server.publisher("1.output", stop=stop)
        publisher.begin_window(1)
        stop.set()
        with pytest.raises(PublishAborted, match="its operator was stopped"):
            publisher.data(1, pa.record_batch({"x": [1]}))
        with pytest.raises(PublishAborted):
            publisher.end_window(1)
