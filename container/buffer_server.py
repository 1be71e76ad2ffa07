"""The buffer server: keeps each output stream's windows so downstream inputs can pull and replay.

One per container. Publishers live in the same process and append messages directly
(``BufferServer.publisher``); subscribers, local or remote, pull over Arrow Flight with
``do_get`` and a JSON ticket ``{"stream": id, "from_window": w}``. A subscription first
receives every retained message of the windows after ``from_window``, in order, then
stays open and receives new messages as they are published (long poll), until
``END_STREAM`` or the server closes.

Storage is one append-only message list per stream, addressed by absolute sequence
numbers, so purging the front (committed windows) or rewinding the back (a publisher
restarted from its checkpoint) never invalidates a subscriber's position. Payloads are
the publisher's Arrow IPC bytes, forwarded without re-encoding; nothing here touches rows.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import logging
import threading
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as flight

from container.control import ENVELOPE_SCHEMA, Kind, Message, to_envelope

__all__ = ["MAX_ENVELOPE_BYTES", "BufferServer", "Publisher"]

_LOGGER = logging.getLogger(__name__)

MAX_ENVELOPE_BYTES = 8 << 20
"""Payload bytes per envelope batch sent to a subscriber (one bigger message goes alone)."""

_POLL_S = 0.2
"""How often a waiting subscription checks for cancellation and shutdown."""

_SHUTDOWN_WAIT_S = 2.0
"""How long ``close()`` waits for gRPC to finish open calls before leaving it to a thread."""


def _window_of(message: Message) -> int:
    return message.window_id


@dataclasses.dataclass(slots=True)
class _Cursor:
    """A subscription's position: the next sequence number to read (None: not placed yet)."""

    from_window: int
    seq: int | None = None
    rewinds_seen: int = 0


class _Stream:
    """One stream's retained messages. Every field is guarded by ``cond``.

    Messages are kept in publishing order with non-decreasing window ids; ``first_seq``
    is the sequence number of ``messages[0]``. END_STREAM, once published, is the last
    message and survives purges so late subscribers still see the end.
    """

    def __init__(self, stream_id: str) -> None:
        self.stream_id = stream_id
        self.cond = threading.Condition()
        self.messages: list[Message] = []
        self.first_seq = 0
        self.nbytes = 0
        self.last_window: int | None = None
        self.ended = False
        self.rewinds: list[int] = []  # the end sequence number after each rewind

    @property
    def end_seq(self) -> int:
        return self.first_seq + len(self.messages)

    def append(self, message: Message) -> None:
        with self.cond:
            if self.ended:
                raise ValueError(f"stream {self.stream_id!r}: {message.kind.name} published "
                                 "after END_STREAM")
            if self.last_window is not None and message.window_id < self.last_window:
                raise ValueError(
                    f"stream {self.stream_id!r}: {message.kind.name} of window "
                    f"{message.window_id} after window {self.last_window}: windows must not "
                    "go back (restart the publisher with from_window to republish)")
            self.messages.append(message)
            self.nbytes += message.nbytes
            self.last_window = message.window_id
            if message.kind == Kind.END_STREAM:
                self.ended = True
            self.cond.notify_all()

    def end(self) -> None:
        """Appends END_STREAM, stamped with the last window published (-1 if none)."""
        with self.cond:
            window = -1 if self.last_window is None else self.last_window
            self.append(Message(Kind.END_STREAM, window))

    def purge(self, window_id: int) -> int:
        """Drops the messages of windows <= ``window_id`` (END_STREAM stays); returns count."""
        with self.cond:
            count = bisect.bisect_right(self.messages, window_id, key=_window_of)
            if self.ended:
                count = min(count, len(self.messages) - 1)
            if count <= 0:
                return 0
            self.nbytes -= sum(m.nbytes for m in self.messages[:count])
            del self.messages[:count]
            self.first_seq += count
            return count

    def rewind(self, window_id: int) -> int:
        """Drops the messages of windows > ``window_id`` and END_STREAM; returns count."""
        with self.cond:
            keep = bisect.bisect_right(self.messages, window_id, key=_window_of)
            if self.ended and keep == len(self.messages):
                keep -= 1
            count = len(self.messages) - keep
            self.nbytes -= sum(m.nbytes for m in self.messages[keep:])
            del self.messages[keep:]
            self.ended = False
            self.last_window = self.messages[-1].window_id if self.messages else None
            self.rewinds.append(self.end_seq)
            self.cond.notify_all()
            return count

    def take(self, cursor: _Cursor, max_bytes: int) -> list[Message]:
        """The next messages for ``cursor`` (at most ``max_bytes`` of payload unless one
        message is bigger), advancing it. Call with ``cond`` held."""
        if cursor.seq is None:
            start = bisect.bisect_right(self.messages, cursor.from_window, key=_window_of)
            if self.ended:
                start = min(start, len(self.messages) - 1)
            cursor.seq = self.first_seq + start
            cursor.rewinds_seen = len(self.rewinds)
        elif cursor.rewinds_seen < len(self.rewinds):
            cursor.seq = min(cursor.seq, *self.rewinds[cursor.rewinds_seen:])
            cursor.rewinds_seen = len(self.rewinds)
        index = max(cursor.seq - self.first_seq, 0)  # purged messages are skipped
        out: list[Message] = []
        size = 0
        while index < len(self.messages):
            message = self.messages[index]
            if out and size + message.nbytes > max_bytes:
                break
            index += 1
            if message.window_id <= cursor.from_window and message.kind != Kind.END_STREAM:
                continue
            out.append(message)
            size += message.nbytes
        cursor.seq = self.first_seq + index
        return out


class Publisher:
    """Appends one output port's messages to its stream on the local buffer server.

    Used by one thread (the operator's). Window ids must not decrease.
    """

    def __init__(self, stream: _Stream) -> None:
        self._stream = stream
        self.bytes_published = 0
        self.messages_published = 0

    @property
    def stream_id(self) -> str:
        return self._stream.stream_id

    def publish(self, message: Message) -> None:
        """Appends one message; subscribers waiting on the stream wake up."""
        self._stream.append(message)
        self.messages_published += 1
        self.bytes_published += message.nbytes

    def begin_window(self, window_id: int) -> None:
        self.publish(Message(Kind.BEGIN_WINDOW, window_id))

    def data(self, window_id: int, batch: pa.RecordBatch) -> None:
        """Publishes one batch of window ``window_id`` (encoded once, as Arrow IPC)."""
        self.publish(Message.data(window_id, batch))

    def end_window(self, window_id: int) -> None:
        self.publish(Message(Kind.END_WINDOW, window_id))

    def reset_window(self, window_id: int) -> None:
        self.publish(Message(Kind.RESET_WINDOW, window_id))

    def end_stream(self) -> None:
        """Publishes END_STREAM; the stream takes no more messages."""
        self._stream.end()
        self.messages_published += 1


class _FlightService(flight.FlightServerBase):
    """The Flight face of a ``BufferServer``: ``do_get`` only."""

    def __init__(self, owner: BufferServer, location: str) -> None:
        super().__init__(location)
        self._owner = owner

    def do_get(self, context: flight.ServerCallContext,
               ticket: flight.Ticket) -> flight.FlightDataStream:
        stream_id, from_window = _parse_ticket(ticket.ticket)
        _LOGGER.debug("subscriber %s: stream %s from window %d", context.peer(), stream_id,
                      from_window)
        return flight.GeneratorStream(
            ENVELOPE_SCHEMA, self._owner._serve(context, stream_id, from_window))


def _parse_ticket(raw: bytes) -> tuple[str, int]:
    try:
        request = json.loads(raw)
        stream_id = request["stream"]
        from_window = request.get("from_window", -1)
        if not isinstance(stream_id, str) or not isinstance(from_window, int):
            raise TypeError("'stream' must be a string and 'from_window' an integer")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise flight.FlightServerError(f"bad buffer-server ticket {raw[:200]!r}: {exc}") from exc
    return stream_id, from_window


class BufferServer:
    """An Arrow Flight server holding this container's output streams.

    ``start()`` binds and serves on gRPC's own worker threads; ``close()`` ends every
    open subscription and stops serving (idempotent, returns promptly). Publishing and
    purging are in-process calls, safe from any thread.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 max_envelope_bytes: int = MAX_ENVELOPE_BYTES) -> None:
        self._host = host
        self._port = port
        self._max_envelope_bytes = max_envelope_bytes
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._service: _FlightService | None = None
        self._started = False
        self._subscribers = 0

    def start(self) -> BufferServer:
        """Binds and starts serving; returns self."""
        with self._lock:
            if self._closed.is_set():
                raise RuntimeError("buffer server already closed")
            if self._service is None:
                self._service = _FlightService(self, f"grpc+tcp://{self._host}:{self._port}")
                self._port = self._service.port
                self._started = True
                _LOGGER.info("buffer server listening on %s:%d", self._host, self._port)
        return self

    @property
    def address(self) -> tuple[str, int]:
        """The bound host and port (the real port once started; kept after close)."""
        if not self._started:
            raise RuntimeError("buffer server not started")
        return self._host, self._port

    @property
    def subscribers(self) -> int:
        """Subscriptions currently open."""
        with self._lock:
            return self._subscribers

    def close(self) -> None:
        """Ends every subscription (without END_STREAM) and stops the Flight server.

        Stops accepting calls at once. A subscriber that stopped reading while the
        server was blocked sending to it keeps its call open until it reads, cancels or
        disconnects; ``close()`` does not wait for it past a short grace period, and
        the gRPC server finishes shutting down in a background thread.
        """
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            service, self._service = self._service, None
            streams = list(self._streams.values())
        for stream in streams:
            with stream.cond:
                stream.cond.notify_all()
        if service is None:
            return
        # shutdown() blocks until every call ends, and a call blocked writing to a
        # client that does not read only ends with the client: bound the wait.
        stopper = threading.Thread(target=service.shutdown, daemon=True,
                                   name=f"buffer-server-{self._port}-shutdown")
        stopper.start()
        stopper.join(_SHUTDOWN_WAIT_S)
        if stopper.is_alive():
            _LOGGER.warning("buffer server %s:%d closed; %d subscription(s) still draining",
                            self._host, self._port, self.subscribers)
        else:
            _LOGGER.info("buffer server %s:%d closed", self._host, self._port)

    def __enter__(self) -> BufferServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _stream(self, stream_id: str) -> _Stream:
        with self._lock:
            stream = self._streams.get(stream_id)
            if stream is None:
                stream = self._streams[stream_id] = _Stream(stream_id)
            return stream

    def publisher(self, stream_id: str, from_window: int | None = None) -> Publisher:
        """A publisher for ``stream_id`` (``"<operator id>.<port>"``), creating the stream.

        A publisher restarted from a checkpoint passes the checkpoint's window as
        ``from_window``: the retained messages of later windows (and END_STREAM) are
        dropped so it can publish them again, and open subscriptions that had read past
        that point continue from the republished messages.
        """
        stream = self._stream(stream_id)
        if from_window is not None:
            dropped = stream.rewind(from_window)
            _LOGGER.debug("stream %s rewound to window %d: %d messages dropped", stream_id,
                          from_window, dropped)
        return Publisher(stream)

    def purge(self, stream_id: str, window_id: int) -> None:
        """Drops the stream's messages of windows <= ``window_id`` (committed windows)."""
        with self._lock:
            stream = self._streams.get(stream_id)
        if stream is not None:
            dropped = stream.purge(window_id)
            _LOGGER.debug("stream %s purged to window %d: %d messages dropped", stream_id,
                          window_id, dropped)

    def stream_stats(self) -> dict[str, tuple[int, int]]:
        """Stream id -> (messages retained, payload bytes retained)."""
        with self._lock:
            streams = list(self._streams.values())
        stats = {}
        for stream in streams:
            with stream.cond:
                stats[stream.stream_id] = (len(stream.messages), stream.nbytes)
        return stats

    def _serve(self, context: flight.ServerCallContext, stream_id: str,
               from_window: int) -> Iterator[pa.RecordBatch]:
        """One subscription: envelope batches until END_STREAM, cancellation or close."""
        stream = self._stream(stream_id)  # a subscriber may come before its publisher
        cursor = _Cursor(from_window)
        with self._lock:
            self._subscribers += 1
        try:
            while True:
                with stream.cond:
                    while True:
                        if self._closed.is_set():
                            return
                        messages = stream.take(cursor, self._max_envelope_bytes)
                        if messages:
                            break
                        if context.is_cancelled():
                            _LOGGER.debug("subscriber of %s cancelled", stream_id)
                            return
                        stream.cond.wait(_POLL_S)
                yield to_envelope(messages)
                if messages[-1].kind == Kind.END_STREAM:
                    _LOGGER.debug("subscriber of %s reached END_STREAM", stream_id)
                    return
        finally:
            with self._lock:
                self._subscribers -= 1
