"""An input whose upstream runs in the same container reads the buffer server's retained
stream directly (``LocalSubscription``), never over Flight, and gets what a Flight
subscriber gets: every window in order, replays, spilled blocks, rewinds, partitions,
window gaps, and an end when the server closes. ``subscriber`` picks it by address."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from tests.container.test_buffer_server import (
    _STREAM,
    _Background,
    _check_numbers,
    _expected,
    _publish_numbers,
    _publish_window,
    _shape,
)
from weir.container.buffer_client import BufferServerUnavailable, Subscription
from weir.container.buffer_server import BufferServer
from weir.container.flight_service import FlightService
from weir.container.input_subscriptions import subscriber
from weir.container.local_subscription import LocalSubscription
from weir.container.port_input import PortInput
from weir.container.stream_messages import Kind, Message, PartitionKeyMissing, WindowGap
from weir.operators.partitioning import PartitionFilter
from weir.proto import plan_pb2

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server(monkeypatch) -> Iterator[BufferServer]:
    """A server whose Flight face fails any call: what is read here was read directly."""
    with BufferServer() as srv:
        _no_flight(monkeypatch, srv)
        yield srv


def _no_flight(monkeypatch, srv: BufferServer) -> None:
    def refuse(*args, **kwargs):
        raise flight.FlightServerError("a local subscriber went through Flight")

    monkeypatch.setattr(FlightService, "do_get", refuse)
    host, port = srv.address
    with pytest.raises(flight.FlightServerError, match="went through Flight"):
        list(Subscription(host, port, "0.nothing", timeout_s=10))  # the refusal works


def _local(srv: BufferServer, from_window: int = -1, **kwargs) -> list[Message]:
    return list(LocalSubscription(srv, _STREAM, from_window, **kwargs))


def test_a_late_subscriber_gets_every_window_in_order_and_replays_from_a_window(server):
    pub = server.publisher(_STREAM)
    for w in (1, 2, 3):
        _publish_window(pub, w)
    pub.end_stream()
    assert _shape(_local(server)) == _expected([1, 2, 3]) + [(Kind.END_STREAM, 3)]
    assert _shape(_local(server, 1)) == _expected([2, 3]) + [(Kind.END_STREAM, 3)]
    sub = LocalSubscription(server, _STREAM)
    messages = list(sub)
    assert [m.batch() for m in messages if m.kind == Kind.DATA] == [
        m.batch() for m in _local(server) if m.kind == Kind.DATA]
    assert sub.messages_received == len(messages) == 13
    assert sub.bytes_received == sum(m.nbytes for m in messages) > 0
    with pytest.raises(RuntimeError, match="only once"):
        iter(sub)


def test_a_live_subscriber_gets_messages_as_published_and_a_rewind(server):
    pub = server.publisher(_STREAM)
    _publish_window(pub, 1)
    live = _Background(LocalSubscription(server, _STREAM))
    assert _shape(live.take(4)) == _expected([1])
    _publish_window(pub, 2)
    assert _shape(live.take(4)) == _expected([2])
    restarted = server.publisher(_STREAM, from_window=1)  # back to its checkpoint
    _publish_window(restarted, 2, batches=1)
    restarted.end_stream()
    assert _shape(live.take(4)) == _expected([2], batches=1) + [(Kind.END_STREAM, 2)]
    assert live.next() is None


def test_spilled_windows_are_read_back_from_disk(tmp_path, monkeypatch):
    with BufferServer(memory_budget_bytes=64_000, disk_budget_bytes=10_000_000,
                      block_bytes=24_000, spill_dir=tmp_path) as srv:
        _no_flight(monkeypatch, srv)
        pub = srv.publisher(_STREAM)
        _publish_numbers(pub, range(30))
        pub.end_stream()
        assert srv.stats().disk_bytes > 0
        for from_window in (-1, 4, 27):
            messages = _local(srv, from_window)
            assert messages[-1].kind == Kind.END_STREAM
            _check_numbers(messages[:-1], range(from_window + 1, 30))
        assert srv.stats().blocks_read > 0


def test_a_partition_gets_the_rows_a_flight_subscriber_of_it_gets():
    words = [f"w{i}" for i in range(200)]
    partition = PartitionFilter("word", 3, frozenset({0, 2}))
    with BufferServer() as srv:
        pub = srv.publisher(_STREAM)
        pub.begin_window(1)
        pub.data(1, pa.record_batch({"word": words}))
        pub.end_window(1)
        pub.end_stream()
        host, port = srv.address
        over_flight = list(Subscription(host, port, _STREAM, partition=partition,
                                        timeout_s=10))
        local = _local(srv, partition=partition)
    assert _shape(local) == _shape(over_flight)
    [here] = [m.batch() for m in local if m.kind == Kind.DATA]
    [there] = [m.batch() for m in over_flight if m.kind == Kind.DATA]
    assert here == there and 0 < here.num_rows < len(words)


def test_a_missing_partition_key_and_a_gap_are_the_flight_errors(server):
    pub = server.publisher(_STREAM)
    _publish_window(pub, 1)
    with pytest.raises(PartitionKeyMissing, match="partition filter: .*missing"):
        _local(server, partition=PartitionFilter("missing", 3, frozenset({0})))
    _publish_window(pub, 2)
    server.purge(_STREAM, 1)
    with pytest.raises(WindowGap, match="holds only the windows after"):
        _local(server, -1)


def test_close_ends_a_waiting_subscriber_quietly_and_a_server_close_is_unavailable(server):
    sub = LocalSubscription(server, _STREAM)
    quiet = _Background(sub)
    server.publisher(_STREAM).begin_window(1)
    assert _shape(quiet.take(1)) == [(Kind.BEGIN_WINDOW, 1)]
    sub.close()
    assert quiet.next() is None and sub.closed
    waiting = _Background(LocalSubscription(server, _STREAM, 1))
    closer = threading.Thread(target=server.close, daemon=True)
    closer.start()
    closer.join(10)
    assert isinstance(waiting.next(), BufferServerUnavailable)


@contextlib.contextmanager
def _here_and_there() -> Iterator[tuple[BufferServer, BufferServer]]:
    """This container's server and another's, each holding window 1 of stream "4.output",
    then its end."""
    with BufferServer() as srv, BufferServer() as other:
        for each in (srv, other):
            pub = each.publisher("4.output")
            _publish_window(pub, 1)
            pub.end_stream()
        yield srv, other


def _input_from(address: tuple[str, int]) -> plan_pb2.InputDeployInfo:
    return plan_pb2.InputDeployInfo(
        port_name="input", source_node_id=4, source_port_name="output",
        buffer_server_host=address[0], buffer_server_port=address[1])


def test_an_input_reads_its_own_containers_stream_directly_and_others_over_flight():
    with _here_and_there() as (srv, other):
        for address, kind in ((srv.address, LocalSubscription), (other.address, Subscription)):
            messages, cancel = subscriber(_input_from(address), None, srv, srv.address,
                                          secret=None)(-1)
            assert isinstance(messages, kind)
            assert _shape(list(messages)) == _expected([1]) + [(Kind.END_STREAM, 1)]
            cancel()


def test_an_input_port_reports_the_transport_its_subscription_takes():
    with _here_and_there() as (srv, other):
        for address, transport in ((srv.address, "local"), (other.address, "flight")):
            stopped = threading.Event()
            port = PortInput("input", subscriber(_input_from(address), None, srv, srv.address),
                             8, stopped)
            assert port.transport == ""  # nothing subscribed yet
            port.start()
            try:
                kinds = [port.get().kind for _ in range(len(_expected([1])) + 1)]
                assert kinds[-1] == Kind.END_STREAM
                assert port.transport == transport
            finally:
                stopped.set()
