"""What an operator runner is given (``container.window_loop``): where its output
ports publish, where its checkpoints go, and the clock it goes by."""

from __future__ import annotations

import time
from typing import Protocol

from weir.operators.operator import Operator
from weir.runtime.window_engine import Output

__all__ = ["SYSTEM_CLOCK", "Checkpointer", "Clock", "Publisher", "SystemClock"]


class Publisher(Output, Protocol):
    """The output side of a port in a container (the window engine's ``Output``): the
    buffer server's in-process publisher, which also counts the bytes it published."""

    bytes_published: int


class Checkpointer(Protocol):
    """Saves operator state durably and forgets what the committed window made useless."""

    def checkpoint(self, operator_id: int, window_id: int, operator: Operator) -> int:
        """Saves ``operator``'s state as of the end of ``window_id``; returns bytes written."""
        ...

    def committed(self, operator_id: int, window_id: int) -> None:
        """Deletes the operator's checkpoints older than the committed ``window_id``."""
        ...

    def has(self, operator_id: int, window_id: int) -> bool:
        """Whether the operator's checkpoint of ``window_id`` is saved."""
        ...


class Clock(Protocol):
    """The time the window loop goes by (a test steps a fake one instead of sleeping)."""

    def now_ms(self) -> int:
        """Epoch milliseconds: window ids count from the application's start in them."""

    def monotonic(self) -> float:
        """Seconds, for a window's deadline."""

    def sleep(self, seconds: float) -> None:
        """Idles an input operator that had nothing to emit."""


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK = SystemClock()
