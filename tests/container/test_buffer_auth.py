"""A container's buffer server serves only callers with the master's secret; TLS optional."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from weir.container.buffer_client import BufferServerUnavailable, Subscription, subscribe
from weir.container.buffer_server import BufferServer
from weir.container.stream_messages import Kind

pytestmark = pytest.mark.timeout(60)

_SECRET = "the-masters-secret"
_WAIT_S = 10.0
_TICKET = flight.Ticket(json.dumps({"stream": "1.output", "from_window": -1}).encode())


def _publish(server: BufferServer) -> None:
    publisher = server.publisher("1.output")
    publisher.begin_window(1)
    publisher.data(1, pa.record_batch({"x": [1, 2, 3]}))
    publisher.end_window(1)
    publisher.end_stream()


def _kinds(messages) -> list[Kind]:
    return [m.kind for m in messages]


@pytest.fixture
def server():
    with BufferServer(secret=_SECRET) as srv:
        _publish(srv)
        yield srv


@pytest.mark.parametrize("headers", [[], [(b"authorization", b"Bearer wrong")],
                                     [(b"authorization", _SECRET.encode())]])
def test_flight_calls_without_the_secret_are_refused(server, headers):
    host, port = server.address
    options = flight.FlightCallOptions(timeout=_WAIT_S, headers=headers)
    with flight.FlightClient(f"grpc+tcp://{host}:{port}") as client:
        with pytest.raises(flight.FlightUnauthenticatedError, match="master's secret"):
            client.do_get(_TICKET, options).read_all()
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(client.list_flights(options=options))
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(client.list_actions(options=options))
    assert server.subscribers == 0


def test_a_subscription_with_the_secret_reads_the_stream(server):
    host, port = server.address
    messages = list(subscribe(host, port, "1.output", timeout_s=_WAIT_S, secret=_SECRET))
    assert _kinds(messages) == [Kind.BEGIN_WINDOW, Kind.DATA, Kind.END_WINDOW, Kind.END_STREAM]
    with pytest.raises(flight.FlightUnauthenticatedError):
        next(iter(Subscription(host, port, "1.output", timeout_s=_WAIT_S)))
    with pytest.raises(flight.FlightUnauthenticatedError):
        next(iter(Subscription(host, port, "1.output", timeout_s=_WAIT_S, secret="wrong")))


def test_tls_buffer_server(tls_files):
    cert, key = tls_files
    with BufferServer(secret=_SECRET, tls=(cert.read_bytes(), key.read_bytes())) as server:
        _publish(server)
        host, port = server.address
        messages = list(subscribe(host, port, "1.output", timeout_s=_WAIT_S, secret=_SECRET,
                                  tls_root_certs=cert.read_bytes()))
        assert _kinds(messages)[-1] == Kind.END_STREAM
        with pytest.raises(flight.FlightUnauthenticatedError):
            next(subscribe(host, port, "1.output", timeout_s=_WAIT_S,
                           tls_root_certs=cert.read_bytes()))
        with pytest.raises(BufferServerUnavailable):  # plaintext gets nowhere
            next(subscribe(host, port, "1.output", timeout_s=_WAIT_S, secret=_SECRET))
