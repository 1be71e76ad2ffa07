"""The subscriber side of the buffer server: a blocking iterator over one stream's messages.

An input port pulls its upstream stream with ``Subscription`` (or ``subscribe``): the
messages of every window after ``from_window``, in order, then new ones as the publisher
emits them, ending after ``END_STREAM``. ``Subscription.close()`` cancels the Flight call
from any thread, so a runtime can stop a subscriber thread that is blocked waiting.
A container's buffer server wants the master's secret on every call: pass ``secret``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import ClassVar

import pyarrow.flight as flight

from weir.container.stream_messages import (
    PARTITION_FILTER_ERROR,
    WINDOW_GAP_ERROR,
    Kind,
    Message,
    PartitionKeyMissing,
    WindowGap,
    from_envelope,
)
from weir.operators.partitioning import PartitionFilter
from weir.proto.contract import AUTH_HEADER, BEARER, pinned_server_name

__all__ = ["BufferServerUnavailable", "IteratedOnce", "PartitionKeyMissing", "Subscription",
           "subscribe"]


_LOGGER = logging.getLogger(__name__)

class BufferServerUnavailable(ConnectionError):
    """The buffer server cannot be reached, or went away before the stream's END_STREAM."""


def _reason(exc: BaseException) -> str:
    """The gist of a Flight error, without gRPC's debug context."""
    return str(exc).split(". gRPC client debug context", 1)[0]


class IteratedOnce:
    """A subscription's life: iterated once, from one thread (``_messages``); ``close``
    from any thread ends it quietly."""

    #: how it reads, reported in the input port's stats: "local" or "flight"
    transport: ClassVar[str] = ""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    def __iter__(self) -> Iterator[Message]:
        with self._lock:
            if self._started:
                raise RuntimeError(f"{self!r} can be iterated only once")
            self._started = True
        return self._messages()

    def _messages(self) -> Iterator[Message]:
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True


class Subscription(IteratedOnce):
    """One subscription to ``stream_id`` on the buffer server at ``host:port``.

    Iterate it once (from one thread); the call opens on the first ``next()``, which is
    also where connection errors surface. ``timeout_s`` bounds the whole subscription
    (a gRPC deadline): past it, iteration raises ``TimeoutError``; None waits forever.

    ``secret`` (the master's) goes with the call; ``tls_root_certs`` (PEM) makes it a TLS
    call trusting them. ``partition`` asks the server for one partition's rows only.
    ``latest``: start at the stream's newest window instead (but never at or before
    ``from_window``): an AT_MOST_ONCE reader skips what it missed. ``generation``: read
    only what that deployment of the upstream operator publishes (0: any).

    Raises (while iterating):
        BufferServerUnavailable: the server is unreachable, or closed the stream
            without END_STREAM (it shut down).
        TimeoutError: ``timeout_s`` elapsed before END_STREAM.
        pyarrow.flight.FlightUnauthenticatedError: the server refused the secret.
        WindowGap: the stream does not hold every window after ``from_window``.
    """

    transport = "flight"

    def __init__(self, host: str, port: int, stream_id: str, from_window: int = -1,
                 timeout_s: float | None = None, *, secret: str | None = None,
                 tls_root_certs: bytes | None = None,
                 partition: PartitionFilter | None = None, latest: bool = False,
                 generation: int = 0) -> None:
        self.secret = secret
        self.latest = latest
        self.generation = generation
        self.partition = partition
        self.tls_root_certs = tls_root_certs
        self.host = host
        self.port = port
        self.stream_id = stream_id
        self.from_window = from_window
        self.timeout_s = timeout_s
        self.messages_received = 0
        self.bytes_received = 0
        self.envelopes_received = 0
        super().__init__()
        self._reader: flight.FlightStreamReader | None = None

    def __repr__(self) -> str:
        return (f"Subscription({self.host}:{self.port}, {self.stream_id!r}, "
                f"from_window={self.from_window})")

    def close(self) -> None:
        """Cancels the subscription; an iteration blocked in another thread ends quietly."""
        with self._lock:
            self._closed = True
            reader = self._reader
        if reader is not None:
            reader.cancel()
            _LOGGER.debug("%r cancelled", self)

    def _error(self, exc: flight.FlightError) -> Exception:
        where = f"buffer server {self.host}:{self.port}"
        if isinstance(exc, flight.FlightTimedOutError):
            return TimeoutError(f"{where}: stream {self.stream_id!r} did not end within "
                                f"{self.timeout_s} s")
        if isinstance(exc, (flight.FlightUnavailableError, flight.FlightCancelledError)):
            return BufferServerUnavailable(f"{where} unavailable (stream {self.stream_id!r}): "
                                           f"{_reason(exc)}")
        if WINDOW_GAP_ERROR in str(exc):
            return WindowGap(f"{where}: {_reason(exc).split(WINDOW_GAP_ERROR, 1)[1].strip()}")
        if PARTITION_FILTER_ERROR in str(exc):
            return PartitionKeyMissing(f"stream {self.stream_id!r} from {where}: "
                                       f"{_reason(exc)}")
        return exc

    def _open(self) -> tuple[flight.FlightClient, flight.FlightStreamReader] | None:
        request: dict[str, object] = {"stream": self.stream_id, "from_window": self.from_window}
        if self.partition is not None:
            request["partition"] = self.partition.to_json()
        if self.latest:
            request["latest"] = True
        if self.generation:
            request["generation"] = self.generation
        ticket = flight.Ticket(json.dumps(request).encode())
        headers = ([(AUTH_HEADER.encode(), (BEARER + self.secret).encode())]
                   if self.secret else [])
        options = flight.FlightCallOptions(timeout=self.timeout_s, headers=headers)
        if self.tls_root_certs is None:
            client = flight.FlightClient(f"grpc+tcp://{self.host}:{self.port}")
        else:
            client = flight.FlightClient(f"grpc+tls://{self.host}:{self.port}",
                                         tls_root_certs=self.tls_root_certs,
                                         override_hostname=pinned_server_name(
                                             self.tls_root_certs))
        try:
            reader = client.do_get(ticket, options)
        except flight.FlightError as exc:
            client.close()
            raise self._error(exc) from exc
        with self._lock:
            if self._closed:
                reader.cancel()
                client.close()
                return None
            self._reader = reader
        _LOGGER.debug("%r opened", self)
        return client, reader

    def _messages(self) -> Iterator[Message]:
        opened = None if self._closed else self._open()
        if opened is None:
            return
        client, reader = opened
        finished = False
        try:
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    if self._closed:
                        return
                    raise BufferServerUnavailable(
                        f"buffer server {self.host}:{self.port} ended stream "
                        f"{self.stream_id!r} without END_STREAM (server closed)") from None
                except flight.FlightError as exc:
                    if self._closed:
                        return
                    raise self._error(exc) from exc
                messages = from_envelope(chunk.data)
                self.envelopes_received += 1
                self.messages_received += len(messages)
                self.bytes_received += sum(m.nbytes for m in messages)
                for message in messages:
                    if message.kind == Kind.END_STREAM:
                        finished = True
                        yield message
                        return
                    yield message
        finally:
            with self._lock:
                self._reader = None
            if not finished:
                reader.cancel()
            client.close()


def subscribe(host: str, port: int, stream_id: str, from_window: int = -1,
              timeout_s: float | None = None, *, secret: str | None = None,
              tls_root_certs: bytes | None = None,
              partition: PartitionFilter | None = None) -> Iterator[Message]:
    """The messages of ``stream_id`` after window ``from_window``, ending after END_STREAM.

    See ``Subscription`` for errors and ``timeout_s``; use a ``Subscription`` directly to
    cancel from another thread.
    """
    return iter(Subscription(host, port, stream_id, from_window, timeout_s, secret=secret,
                             tls_root_certs=tls_root_certs, partition=partition))
