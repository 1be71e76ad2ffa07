"""The buffer server: keeps each output stream's windows so downstream inputs can pull and replay.

One per container. Publishers live in the same process and append messages directly
(``BufferServer.publisher``); subscribers in this container read them directly too
(``messages``, ``container.local_subscription``), others pull over Arrow Flight with ``do_get``
and a JSON ticket ``{"stream": id, "from_window": w}``, plus ``"partition": {"column", "mask",
"keys"}`` for one partition of a partitioned operator: that subscriber gets only its rows of
each DATA batch (``operators.partitioning``; markers pass as they are), and ``"latest": true``
to skip to the newest window (AT_MOST_ONCE readers). A subscription first receives every
retained message of the windows after ``from_window`` (a stream that does not hold them all
fails it: ``WindowGap``), in order, then stays open and receives new messages as they are
published (long poll), until ``END_STREAM`` or the server closes. Every Flight call must carry
the master's secret (``authorization: Bearer <secret>``): a stream is the application's data,
and nobody else may read it. Containers always serve it over TLS (the master's certificate).

Retention: every message is kept until ``purge``/``purge_all`` drops the windows up to the
committed window; each stream's messages are a ``container.retained_stream``. Past the memory
budget the publisher that needs room moves the oldest messages of the stream holding most memory
to disk, a block at a time (``container.spill``), and subscribers that reach them read the block
back. Past the disk budget too, publishing waits until a purge frees room: data is never
dropped. A batch stays as published while it is in memory (a subscriber in this container
reads it as it is); it is encoded as Arrow IPC once, when it is first served over Flight or
spilled, and those bytes are what every later reader gets. Only a partition filter touches
rows (and keeps, for the partition, a new batch of what passes).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from weir.container.flight_service import FlightService, filtered
from weir.container.publisher import PublishAborted, Publisher
from weir.container.retained_stream import (
    LATEST_WINDOW,
    MAX_BLOCK_BYTES,
    Block,
    BufferStats,
    Cursor,
    RetainedStream,
    SpillResult,
    StreamStats,
)
from weir.container.spill import Budget, SpillStore, read_block
from weir.container.stream_messages import Kind, Message, WindowGap
from weir.operators.partitioning import PartitionFilter
from weir.proto import umbilical_pb2

__all__ = ["DISK_BUDGET_BYTES", "LATEST_WINDOW", "MAX_BLOCK_BYTES", "MAX_ENVELOPE_BYTES",
           "MEMORY_BUDGET_BYTES", "BufferServer", "BufferStats", "StreamStats"]

_LOGGER = logging.getLogger(__name__)

MAX_ENVELOPE_BYTES = 8 << 20
"""Payload bytes per envelope batch sent to a subscriber (one bigger message goes alone)."""

MEMORY_BUDGET_BYTES = 256 << 20
"""Default payload bytes a buffer server keeps in memory before spilling to disk."""

DISK_BUDGET_BYTES = 4 << 30
"""Default payload bytes a buffer server spills before publishers have to wait."""

_POLL_S = 0.2
"""How often a waiting subscription or publisher checks for cancellation and shutdown."""

_SHUTDOWN_WAIT_S = 2.0
"""How long ``close()`` waits for gRPC to finish open calls before leaving it to a thread."""


class BufferServer:
    """An Arrow Flight server holding this container's output streams.

    ``start()`` binds and serves on gRPC's own worker threads; ``close()`` ends every
    open subscription, wakes blocked publishers, stops serving and removes the spill
    folder (idempotent, returns promptly). Publishing and purging are in-process calls,
    safe from any thread.

    Args:
        host, port: where to listen (port 0: any free port).
        max_envelope_bytes: payload bytes per envelope sent to a subscriber.
        memory_budget_bytes: payload bytes kept in memory, over all streams, before the
            oldest messages spill to disk.
        disk_budget_bytes: payload bytes spilled, over all streams, before publishers
            wait for purges (0: never spill; publishers wait at the memory budget).
        spill_dir: the folder under which this server makes its own spill folder (the
            system's temporary folder if None); the spill folder is removed at close.
        block_bytes: payload bytes per spill file (default: an eighth of the memory
            budget, at most ``MAX_BLOCK_BYTES``).
        secret: the master's secret, required on every call; None accepts anyone (for
            in-process tests: a container always passes its master's secret).
        tls: serve TLS with this (certificate, private key), PEM; plaintext if None.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 max_envelope_bytes: int = MAX_ENVELOPE_BYTES, *,
                 memory_budget_bytes: int = MEMORY_BUDGET_BYTES,
                 disk_budget_bytes: int = DISK_BUDGET_BYTES,
                 spill_dir: str | os.PathLike[str] | None = None,
                 block_bytes: int | None = None, secret: str | None = None,
                 tls: tuple[bytes, bytes] | None = None) -> None:
        if memory_budget_bytes < 0 or disk_budget_bytes < 0:
            raise ValueError("buffer-server budgets must not be negative")
        if block_bytes is not None and block_bytes <= 0:
            raise ValueError("block_bytes must be positive")
        self._host = host
        self._port = port
        self._max_envelope_bytes = max_envelope_bytes
        self._secret = secret
        self._tls = tls
        self._budget = Budget(memory_budget_bytes, disk_budget_bytes)
        self._store = SpillStore(spill_dir)
        self._block_bytes = block_bytes or max(1, min(memory_budget_bytes // 8,
                                                      MAX_BLOCK_BYTES))
        self._streams: dict[str, RetainedStream] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._service: FlightService | None = None
        self._started = False
        self._subscribers = 0

    def start(self) -> BufferServer:
        """Binds and starts serving; returns self."""
        with self._lock:
            if self._closed.is_set():
                raise RuntimeError("buffer server already closed")
            if self._service is None:
                scheme = "grpc+tls" if self._tls else "grpc+tcp"
                self._service = FlightService(self, f"{scheme}://{self._host}:{self._port}",
                                               self._secret, self._tls)
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

    def idle_subscribers(self, stream_id: str) -> int:
        """Subscriptions of ``stream_id`` that were given all there is for them now (a
        suspended stream or another generation: nothing) and wait for more."""
        with self._lock:
            stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        with stream.cond:
            return stream.idle_subscribers

    @property
    def spill_path(self) -> Path | None:
        """This server's spill folder, once something was spilled (None before and after
        close)."""
        return self._store.path

    def room(self) -> umbilical_pb2.BufferServerStats:
        """What it holds against its memory budget, for the heartbeat."""
        return self._budget.stats()

    @property
    def publisher_wait_s(self) -> float:
        """Total seconds publishers spent blocked for room (back-pressure)."""
        with self._budget.cond:
            return self._budget.wait_s

    def close(self) -> None:
        """Ends every subscription (without END_STREAM) and stops the Flight server.

        Stops accepting calls at once; publishers blocked for room raise
        ``PublishAborted``. A subscriber that stopped reading while the server was
        blocked sending to it keeps its call open until it reads, cancels or
        disconnects; ``close()`` does not wait for it past a short grace period, and
        the gRPC server finishes shutting down in a background thread. The spill folder
        is removed.
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
        self._budget.wake()
        try:
            self._shutdown(service)
        finally:
            self._store.close()

    def _shutdown(self, service: FlightService | None) -> None:
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

    def _stream(self, stream_id: str) -> RetainedStream:
        with self._lock:
            stream = self._streams.get(stream_id)
            if stream is None:
                stream = self._streams[stream_id] = RetainedStream(
                    stream_id, len(self._streams), self._budget, self._store,
                    self._block_bytes)
            return stream

    def publisher(self, stream_id: str, from_window: int | None = None,
                  stop: threading.Event | None = None, generation: int = 0) -> Publisher:
        """A publisher for ``stream_id`` (``"<operator id>.<port>"``), creating the stream.

        A publisher restarted from a checkpoint passes the checkpoint's window as
        ``from_window``: the retained messages of later windows (and END_STREAM),
        spilled or not, are dropped so it can publish them again, and open subscriptions
        that had read past that point continue from the republished messages. ``stop``
        (the operator's stop event) ends a wait for room with ``PublishAborted``.
        ``generation`` (the publishing deployment's): subscribers that name another
        generation are not served, and publishers of older ones are refused.

        Raises:
            PublishAborted: a newer generation publishes the stream already.
        """
        stream = self._stream(stream_id)
        with stream.cond:
            if generation and generation < stream.generation:
                raise PublishAborted(f"stream {stream_id!r}: generation {generation} cannot "
                                     f"publish, generation {stream.generation} does")
            stream.generation = max(stream.generation, generation)
        if from_window is not None:
            dropped = stream.rewind(from_window)
            _LOGGER.debug("stream %s rewound to window %d: %d messages dropped", stream_id,
                          from_window, dropped)
        with stream.cond:
            stream.suspended = False
            stream.cond.notify_all()
        return Publisher(self, stream, stop, generation)

    def suspend(self, stream_id: str) -> None:
        """Holds back the stream from subscribers until its next ``publisher()`` call.

        Called when the publishing operator is undeployed: its successor restarts from a
        checkpoint and rewinds the stream, so nothing after that point may be served
        meanwhile (a subscriber would read windows that are about to be replaced).
        """
        stream = self._stream(stream_id)
        with stream.cond:
            stream.suspended = True

    def purge(self, stream_id: str, window_id: int) -> None:
        """Drops the stream's messages of windows <= ``window_id`` (committed windows)."""
        with self._lock:
            stream = self._streams.get(stream_id)
        if stream is not None:
            dropped = stream.purge(window_id)
            _LOGGER.debug("stream %s purged to window %d: %d messages dropped", stream_id,
                          window_id, dropped)

    def purge_all(self, window_id: int) -> None:
        """Drops every stream's messages of windows <= ``window_id`` (the committed window)."""
        with self._lock:
            streams = list(self._streams)
        for stream_id in streams:
            self.purge(stream_id, window_id)

    def stream_stats(self) -> dict[str, StreamStats]:
        """Stream id -> (messages retained, payload bytes in memory, payload bytes on disk)."""
        with self._lock:
            streams = list(self._streams.values())
        return {stream.stream_id: stream.stats() for stream in streams}

    def stats(self) -> BufferStats:
        """Totals over every stream, the budgets, spill and publisher-wait counters."""
        with self._lock:
            streams = list(self._streams.values())
        per_stream = [stream.stats() for stream in streams]
        blocks = 0
        for stream in streams:
            with stream.cond:
                blocks += len(stream.blocks)
        budget = self._budget
        with budget.cond:
            return BufferStats(
                streams=len(streams), messages=sum(s.messages for s in per_stream),
                memory_bytes=sum(s.memory_bytes for s in per_stream),
                disk_bytes=sum(s.disk_bytes for s in per_stream),
                memory_budget_bytes=budget.memory_limit, disk_budget_bytes=budget.disk_limit,
                blocks_on_disk=blocks, blocks_spilled=budget.blocks_spilled,
                blocks_read=budget.blocks_read, publisher_waits=budget.waits,
                publisher_wait_s=budget.wait_s, publishers_waiting=budget.waiting)

    # -- room for publishers -------------------------------------------------------
    def release(self, nbytes: int) -> None:
        """Gives back memory ``admit`` reserved for a message that was not stored."""
        self._budget.release(memory=nbytes)

    def admit(self, stream: RetainedStream, nbytes: int, stop: threading.Event | None,
              ) -> float | None:
        """Reserves memory for a message of ``nbytes``, spilling to make room, or waiting
        for a purge when nothing more can spill.

        Returns None if the publisher did not have to wait, else the seconds it waited.
        """
        budget = self._budget
        started: float | None = None
        try:
            while not budget.reserve_memory(nbytes):
                if not self._closed.is_set() and self._make_room():
                    continue
                with budget.cond:
                    if budget.fits_locked(nbytes):
                        continue  # freed meanwhile: reserve at the top
                    if self._closed.is_set():
                        raise PublishAborted(f"stream {stream.stream_id!r}: buffer server "
                                             "closed while the publisher waited for room")
                    if stop is not None and stop.is_set():
                        raise PublishAborted(f"stream {stream.stream_id!r}: publisher "
                                             "stopped while waiting for room")
                    if started is None:
                        started = time.monotonic()
                        budget.waiting += 1
                        _LOGGER.info(
                            "stream %s: publisher waits for room (memory %d of %d bytes, "
                            "disk %d of %d bytes)", stream.stream_id, budget.memory,
                            budget.memory_limit, budget.disk, budget.disk_limit)
                    budget.cond.wait(_POLL_S)
        finally:
            if started is not None:
                elapsed = time.monotonic() - started
                with budget.cond:
                    budget.waiting -= 1
                    budget.waits += 1
                    budget.wait_s += elapsed
                _LOGGER.info("stream %s: publisher waited %.3f s for room", stream.stream_id,
                             elapsed)
        return None if started is None else elapsed

    def _make_room(self) -> bool:
        """Spills one block of the stream holding the most memory that can; returns
        whether anything moved to disk."""
        with self._lock:
            streams = sorted(self._streams.values(), key=lambda s: s.memory_bytes,
                             reverse=True)
        for stream in streams:
            if stream.memory_bytes <= 0:
                break
            if stream.spill() is SpillResult.SPILLED:
                return True
        return False

    # -- subscriptions -------------------------------------------------------------
    def _load(self, stream: RetainedStream, block: Block) -> list[Message] | None:
        """A spilled block's messages, or None if it was purged or rewound meanwhile."""
        try:
            rows = read_block(block.path)
        except FileNotFoundError:
            with stream.cond:
                if self._closed.is_set() or not any(b is block for b in stream.blocks):
                    return None
            raise
        with self._budget.cond:
            self._budget.blocks_read += 1
        return rows

    def messages(self, stream_id: str, from_window: int,
                 partition: PartitionFilter | None = None, *, latest: bool = False,
                 generation: int = 0, cancelled: Callable[[], bool] = lambda: False,
                 who: str = "a subscriber in this process") -> Iterator[list[Message]]:
        """One subscription's messages, a list at a time (up to an envelope's bytes),
        until END_STREAM, ``cancelled()`` (checked while waiting) or close: what the
        Flight face sends (``flight_service``), and what a subscriber here reads as it is.

        ``partition`` keeps only its rows of every DATA batch, filtered outside the
        stream's lock (publishing goes on meanwhile).

        Raises:
            WindowGap: the stream does not hold every window after ``from_window``.
            PartitionKeyMissing: a batch cannot be split by the partition's column.
        """
        stream = self._stream(stream_id)  # a subscriber may come before its publisher
        cursor = Cursor(from_window, latest=latest, generation=generation)
        loaded: dict[Block, list[Message]] = {}  # the spilled block being read, if any
        with self._lock:
            self._subscribers += 1
        try:
            while True:
                with stream.cond:
                    while True:
                        if self._closed.is_set():
                            return
                        try:
                            messages, needed = stream.take(cursor, self._max_envelope_bytes,
                                                           loaded)
                        except WindowGap as exc:
                            _LOGGER.warning("subscriber %s: %s", who, exc)
                            raise
                        if loaded and cursor.seq is not None and cursor.seq >= stream.first_seq:
                            loaded = {}  # past the spilled part: let the block go
                        if messages or needed is not None:
                            break
                        if cancelled():
                            _LOGGER.debug("subscriber of %s cancelled", stream_id)
                            return
                        stream.idle_subscribers += 1
                        try:
                            stream.cond.wait(_POLL_S)
                        finally:
                            stream.idle_subscribers -= 1
                if needed is not None:  # read outside the lock: publishing goes on
                    rows = self._load(stream, needed)
                    loaded = {} if rows is None else {needed: rows}
                    continue
                if partition is not None:
                    messages = filtered(messages, partition)
                    if not messages:
                        continue
                yield messages
                if messages[-1].kind == Kind.END_STREAM:
                    _LOGGER.debug("subscriber of %s reached END_STREAM", stream_id)
                    return
        finally:
            with self._lock:
                self._subscribers -= 1
