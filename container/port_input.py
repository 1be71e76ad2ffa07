"""One input port: a subscriber thread pulling from the upstream buffer server into a queue.

The queue is bounded (``QUEUE_CAPACITY`` messages), so a slow operator makes its
subscriber wait, and the wait reaches the publisher as back-pressure instead of memory.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable

from container.control import Kind, Message

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
        subscribe: opens the subscription; returns an iterable of messages and a
            function that cancels it from another thread.
        capacity: queue bound in messages.
        stopped: polled while blocking, so an undeployed operator's thread exits.
    """

    def __init__(self, name: str,
                 subscribe: Callable[[], tuple[Iterable[Message], Callable[[], None]]],
                 capacity: int, stopped: threading.Event) -> None:
        self.name = name
        self._subscribe = subscribe
        self._queue: queue.Queue[Message | _Failure] = queue.Queue(maxsize=capacity)
        self._stopped = stopped
        self._head: Message | None = None
        self._cancel: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._pump, name=f"subscriber-{name}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _put(self, item: Message | _Failure) -> bool:
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _pump(self) -> None:
        try:
            messages, self._cancel = self._subscribe()
            for message in messages:
                if not self._put(message) or message.kind == Kind.END_STREAM:
                    return
            if not self._stopped.is_set():
                self._put(_Failure(InputClosed(
                    f"input port {self.name!r}: the upstream stream ended without END_STREAM")))
        except Exception as exc:  # noqa: BLE001 - handed to the operator thread
            if not self._stopped.is_set():
                self._put(_Failure(exc))

    def _take(self) -> Message:
        while True:
            if self._stopped.is_set():
                raise InputClosed(f"input port {self.name!r}: the operator is stopping")
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if isinstance(item, _Failure):
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
