"""A stranger that takes a freed port (a master's, a buffer server's) learns nothing: the
secret goes only to a peer that proved the master's pinned certificate, and nothing it
answers is read (issue 17, item 2).

Each stranger listens where the real server was, after it stopped: a raw socket that
records every byte it receives, and a TLS server with a certificate of its own that even
carries the pinned name (only the key differs) and records every header of every call.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from weir.container.buffer_client import BufferServerUnavailable, Subscription
from weir.container.buffer_server import BufferServer
from weir.container.umbilical_client import MasterUnreachable, UmbilicalClient
from weir.master.client import WeirClient, WeirClientError
from weir.master.launcher import RecordingLauncher
from weir.master.server import MasterServer
from weir.master.tls import TlsFiles, make_self_signed

pytestmark = pytest.mark.timeout(120)


class RawListener:
    """Accepts on ``port`` and records every byte any connection sends."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.received = bytearray()
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.settimeout(0.5)
            with conn:
                for _ in range(10):  # read what it sends, then hang up without answering
                    try:
                        chunk = conn.recv(65536)
                    except OSError:
                        continue
                    if not chunk:
                        break
                    self.received += chunk

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


class _Recorder(grpc.ServerInterceptor):
    def __init__(self) -> None:
        self.metadata: list[tuple[str, str]] = []

    def intercept_service(self, continuation, details):
        self.metadata.extend(details.invocation_metadata or ())
        return continuation(details)


def _grpc_stranger(port: int, tls: TlsFiles) -> tuple[grpc.Server, _Recorder]:
    recorder = _Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(2), interceptors=[recorder])
    assert server.add_secure_port(f"127.0.0.1:{port}", tls.server_credentials()) == port
    server.start()
    return server, recorder


class _HeaderRecorder(flight.ServerMiddlewareFactory):
    def __init__(self) -> None:
        self.headers: list[dict] = []

    def start_call(self, info, headers):
        self.headers.append(dict(headers))


class _FlightStranger(flight.FlightServerBase):
    def do_get(self, context, ticket):
        return flight.RecordBatchStream(pa.table({"x": [1]}))


@pytest.fixture
def stranger_tls(tmp_path) -> TlsFiles:
    """A certificate of the stranger's own, naming the pinned name too."""
    return make_self_signed(tmp_path / "stranger")


@pytest.fixture
def stopped_master(tmp_path) -> Iterator[tuple[str, str, bytes]]:
    """(address, secret, certificate) of a master that has stopped: its port is free."""
    master = MasterServer(launcher_factory=RecordingLauncher, state_dir=tmp_path / "m",
                          http_port=None, publish_secret=False)
    address = master.start()
    secret, cert = master.secret, master.tls.cert.read_bytes()
    master.stop()
    yield address, secret, cert


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_a_raw_listener_on_a_dead_masters_port_receives_no_secret(stopped_master, tmp_path):
    address, secret, cert = stopped_master
    listener = RawListener(_port(address))
    try:
        client = UmbilicalClient(address, secret=secret, tls_root_certs=cert,
                                 call_timeout_s=1.0, retry_window_s=3.0)
        with pytest.raises(MasterUnreachable):
            client.get_init_context("app-0001-c0")
        client.close()
        (tmp_path / "ca.pem").write_bytes(cert)
        with WeirClient(address, secret=secret, tls_ca=tmp_path / "ca.pem",
                        timeout_s=2) as weir, pytest.raises(WeirClientError):
            weir.applications()
    finally:
        listener.close()
    assert listener.connections >= 1  # the container did call, and said only "hello"
    assert secret.encode() not in listener.received
    assert b"authorization" not in listener.received.lower()


def test_a_tls_stranger_on_a_dead_masters_port_gets_no_call(stopped_master, stranger_tls,
                                                            tmp_path):
    address, secret, cert = stopped_master
    server, recorder = _grpc_stranger(_port(address), stranger_tls)
    try:
        client = UmbilicalClient(address, secret=secret, tls_root_certs=cert,
                                 call_timeout_s=1.0, retry_window_s=3.0)
        with pytest.raises(MasterUnreachable):  # and so nothing the stranger says is read
            client.get_init_context("app-0001-c0")
        client.close()
        (tmp_path / "ca.pem").write_bytes(cert)
        with WeirClient(address, secret=secret, tls_ca=tmp_path / "ca.pem",
                        timeout_s=2) as weir, pytest.raises(
                WeirClientError, match="did not prove the master's certificate"):
            weir.applications()
    finally:
        server.stop(None)
    assert recorder.metadata == []  # not one call got through the handshake


def test_a_stranger_on_a_closed_buffer_servers_port_gets_no_secret(stranger_tls, tmp_path):
    master_tls = make_self_signed(tmp_path / "master")
    cert, key = master_tls.cert.read_bytes(), master_tls.key.read_bytes()
    secret = "the-masters-secret"
    real = BufferServer(secret=secret, tls=(cert, key))
    real.start()
    host, port = real.address
    real.close()
    recorder = _HeaderRecorder()
    stranger = _FlightStranger(
        f"grpc+tls://{host}:{port}", middleware={"rec": recorder},
        tls_certificates=[flight.CertKeyPair(stranger_tls.cert.read_bytes(),
                                             stranger_tls.key.read_bytes())])
    try:
        subscription = Subscription(host, port, "1.output", timeout_s=3, secret=secret,
                                    tls_root_certs=cert)
        with pytest.raises(BufferServerUnavailable):
            next(iter(subscription))
    finally:
        stranger.shutdown()
    assert recorder.headers == []
    listener = RawListener(port)
    try:
        subscription = Subscription(host, port, "1.output", timeout_s=3, secret=secret,
                                    tls_root_certs=cert)
        with pytest.raises((BufferServerUnavailable, TimeoutError)):
            next(iter(subscription))
    finally:
        listener.close()
    assert listener.connections >= 1
    assert secret.encode() not in listener.received
