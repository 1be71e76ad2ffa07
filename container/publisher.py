"""An output port's publisher: appends one operator's messages to its stream on the
local buffer server, waiting for room when the server's budgets are full."""

from __future__ import annotations

import threading
from typing import Protocol

import pyarrow as pa

from weir.container.retained_stream import RetainedStream
from weir.container.stream_messages import Kind, Message
from weir.operators.watermarks import NO_WATERMARK

__all__ = ["Admission", "PublishAborted", "Publisher"]


class Admission(Protocol):
    """The buffer server's memory budget, as a publisher sees it."""

    def admit(self, stream: RetainedStream, nbytes: int,
              stop: threading.Event | None) -> float | None: ...

    def release(self, nbytes: int) -> None: ...


class PublishAborted(RuntimeError):
    """A publisher waiting for room gave up: the server closed or its stop event was set.

    The message was not stored.
    """


class Publisher:
    """Appends one output port's messages to its stream on the local buffer server.

    Used by one thread (the operator's). Window ids must not decrease. When the server's
    memory and disk budgets are both full, ``publish`` (and ``data``) block until a purge
    frees room; they raise ``PublishAborted`` if the server closes or ``stop`` is set
    meanwhile. ``wait_s`` and ``waits`` count that blocking.
    """

    def __init__(self, server: Admission, stream: RetainedStream,
                 stop: threading.Event | None = None, generation: int = 0) -> None:
        self._server = server
        self._stream = stream
        self._stop = stop
        self.generation = generation
        self.bytes_published = 0
        self.messages_published = 0
        self.wait_s = 0.0
        self.waits = 0

    @property
    def stream_id(self) -> str:
        return self._stream.stream_id

    def publish(self, message: Message) -> None:
        """Appends one message, once there is room; subscribers waiting on it wake up.

        Raises:
            PublishAborted: the server closed, ``stop`` was set (the operator was
                undeployed: nothing more of it reaches the stream), or a newer deployment
                of the operator publishes this stream now (this one was replaced).
        """
        if self._stop is not None and self._stop.is_set():
            raise PublishAborted(f"stream {self._stream.stream_id!r}: its operator was "
                                 "stopped; it publishes nothing more")
        if self.generation and self._stream.generation > self.generation:
            raise PublishAborted(f"stream {self._stream.stream_id!r}: generation "
                                 f"{self.generation} of its publisher was replaced by "
                                 f"generation {self._stream.generation}")
        nbytes = message.nbytes
        if nbytes:
            with self._stream.cond:
                self._stream.check(message)  # fail before waiting for room
            waited = self._server.admit(self._stream, nbytes, self._stop)
            if waited is not None:
                self.wait_s += waited
                self.waits += 1
        try:
            self._stream.append(message)
        except BaseException:
            self._server.release(nbytes)
            raise
        self.messages_published += 1
        self.bytes_published += nbytes

    def begin_window(self, window_id: int) -> None:
        self.publish(Message(Kind.BEGIN_WINDOW, window_id))

    def data(self, window_id: int, batch: pa.RecordBatch) -> None:
        """Publishes one batch of window ``window_id``, kept as it is (``Message.data``):
        the caller must not change its buffers afterwards."""
        self.publish(Message.data(window_id, batch))

    def end_window(self, window_id: int, watermark: int = NO_WATERMARK) -> None:
        """Publishes END_WINDOW carrying the operator's watermark as of the window's end."""
        self.publish(Message(Kind.END_WINDOW, window_id, watermark=watermark))

    def reset_window(self, window_id: int) -> None:
        self.publish(Message(Kind.RESET_WINDOW, window_id))

    def end_stream(self, watermark: int = NO_WATERMARK) -> None:
        """Publishes END_STREAM; the stream takes no more messages. A ``watermark``: it
        stopped for a savepoint with that watermark (``container.window_loop``)."""
        self._stream.end(watermark)
        self.messages_published += 1
