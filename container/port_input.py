"""One input port: a subscriber thread pulling from the upstream buffer server into a queue.

The queue is bounded (``QUEUE_CAPACITY`` messages), so a slow operator makes its
subscriber wait, and the wait reaches the publisher as back-pressure instead of memory.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable

from weir.container.stream_messages import Kind, Message, WindowGap
from weir.operators.ports import SchemaMismatch
from weir.operators.windows import format_window_id

__all__ = ["InputClosed", "PortInput"]

_LOGGER = logging.getLogger(__name__)
_POLL_S = 0.1


class InputClosed(RuntimeError):
    """The input stopped without END_STREAM (upstream lost, or the runtime is stopping)."""


class _Failure:
    """Queued in place of a message when the subscription broke."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class PortInput:
    """Feeds one input port from a subscription; ``peek``/``get`` block with a stop check.

    Args:
        name: the port name, for errors.
        subscribe: opens the subscription for the windows after the one it is given;
            returns an iterable of messages and a function that cancels it from another
            thread.
        capacity: queue bound in messages.
        max_bytes: queue bound in payload bytes (0: none); a message larger than it is
            still taken when the queue is empty.
        stopped: polled while blocking, so an undeployed operator's thread exits.
        from_window: the first subscription starts after this window.
        retry_s: how long a lost upstream is waited for before the operator fails.
        skip_to_latest: the first subscription starts at the stream's newest window
            instead, never at or before ``from_window`` (AT_MOST_ONCE: what was missed is
            skipped, what was processed is never taken again); ``subscribe`` is then called
            with ``latest=True``. Windows then follow one another without a check.
    """

    def __init__(self, name: str,
                 subscribe: Callable[[int], tuple[Iterable[Message], Callable[[], None]]],
                 capacity: int, stopped: threading.Event, *, from_window: int = -1,
                 retry_s: float = 60.0, skip_to_latest: bool = False,
                 max_bytes: int = 0) -> None:
        self.name = name
        self._max_bytes = max_bytes
        self._queued_bytes = 0
        self._room = threading.Condition()
        self._subscribe = subscribe
        self._from_window = from_window
        self._retry_s = retry_s
        self._skip_to_latest = skip_to_latest
        self._queue: queue.Queue[Message | _Failure] = queue.Queue(maxsize=capacity)
        self._stopped = stopped
        self._head: Message | None = None
        #: how the current subscription reads (the subscription's ``transport``: "local"
        #: or "flight"); "" before the first one, or when the upstream had already ended
        self.transport = ""
        self._cancel: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._pump, name=f"subscriber-{name}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _put(self, item: Message | _Failure) -> bool:
        size = item.nbytes if isinstance(item, Message) else 0
        if self._max_bytes and size:
            with self._room:
                while self._queued_bytes and self._queued_bytes + size > self._max_bytes:
                    if self._stopped.is_set():
                        return False
                    self._room.wait(_POLL_S)
                self._queued_bytes += size
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _pump(self) -> None:
        """Subscribes, and re-subscribes where it left off while the upstream is away.

        An upstream buffer server that vanished belongs to a lost container: the master
        redeploys it, and this operator with it if it must rewind, so the subscriber keeps
        trying rather than failing the operator for someone else's loss.
        """
        from_window, skip = self._from_window, 0
        delivered_in_window = 0
        last_ended: int | None = None  # the last window whose END_WINDOW was queued
        give_up = None
        delay_s = 0.1
        while not self._stopped.is_set():
            try:
                latest = self._skip_to_latest and last_ended is None
                messages, self._cancel = (self._subscribe(from_window, latest=True) if latest
                                          else self._subscribe(from_window))
                self.transport = getattr(messages, "transport", "")
                for message in messages:
                    if skip:  # already delivered before the connection broke
                        skip -= 1
                        continue
                    if message.kind == Kind.BEGIN_WINDOW:
                        self._check_follows(last_ended, message.window_id)
                    if not self._put(message) or message.kind == Kind.END_STREAM:
                        return
                    give_up, delay_s = None, 0.1
                    delivered_in_window += 1
                    if message.kind == Kind.END_WINDOW:
                        from_window, delivered_in_window = message.window_id, 0
                        last_ended = message.window_id
                error: BaseException = InputClosed(
                    f"input port {self.name!r}: the upstream stream ended without END_STREAM")
            except (SchemaMismatch, WindowGap) as exc:  # no retry can help
                self._put(_Failure(exc))
                return
            except Exception as exc:  # noqa: BLE001 - retried, then handed to the operator
                error = exc
            if self._stopped.is_set():
                return
            now = time.monotonic()
            give_up = give_up or now + self._retry_s
            if now > give_up:
                self._put(_Failure(error))
                return
            _LOGGER.info("input port %s: %s; subscribing again after window %s", self.name,
                         error, from_window)
            skip = delivered_in_window
            self._stopped.wait(delay_s)
            delay_s = min(delay_s * 2, 2.0)

    def _check_follows(self, last_ended: int | None, window_id: int) -> None:
        """Raises WindowGap unless ``window_id`` is the window after ``last_ended``.

        The first window of a subscription is the buffer server's to check (it knows which
        windows the stream holds); every later one must follow the one before it.
        """
        if not self._skip_to_latest and last_ended is not None \
                and window_id != last_ended + 1:
            raise WindowGap(f"input port {self.name!r}: window {format_window_id(window_id)} "
                            f"arrived after window {format_window_id(last_ended)}; the windows "
                            "in between are missing from the stream")

    def _take(self) -> Message:
        while True:
            if self._stopped.is_set():
                raise InputClosed(f"input port {self.name!r}: the operator is stopping")
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if self._max_bytes and isinstance(item, Message) and item.nbytes:
                with self._room:
                    self._queued_bytes -= item.nbytes
                    self._room.notify()
            if isinstance(item, _Failure):
                if isinstance(item.error, WindowGap):
                    raise item.error  # already names the port and the windows
                raise InputClosed(f"input port {self.name!r}: {item.error}") from item.error
            return item

    def peek(self) -> Message:
        """The next message, left in place."""
        if self._head is None:
            self._head = self._take()
        return self._head

    def get(self) -> Message:
        """The next message, consumed."""
        message = self.peek()
        self._head = None
        return message

    @property
    def queue_size(self) -> int:
        return self._queue.qsize()

    def close(self) -> None:
        """Cancels the subscription; the caller sets ``stopped`` first."""
        if self._cancel is not None:
            try:
                self._cancel()
            except Exception:  # noqa: BLE001 - closing a broken subscription is best effort
                _LOGGER.debug("cancelling subscription of %s failed", self.name, exc_info=True)
        self._thread.join(timeout=2.0)
