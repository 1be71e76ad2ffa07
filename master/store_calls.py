"""Calls into stores that may never answer, made outside the master's lock and bounded.

A savepoint or state folder can be a ``pyarrow.fs`` URI (S3, HDFS) whose endpoint accepts
and never replies, or a local path on a hung network mount, or a FIFO. The master's core
lock is what every heartbeat needs: a call like that made under it stops every
application's containers. So such calls are made without the lock, in a thread of their
own, and the caller waits for them at most ``STORE_TIMEOUT_S``: past it, the request fails
with ``DeadlineExceeded`` (the thread is left to finish or hang on its own; it holds
nothing of the master's).

>>> call_store(lambda: 42, "the answer")
42
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from weir.master.errors import DeadlineExceeded

__all__ = ["STORE_TIMEOUT_S", "call_store"]

STORE_TIMEOUT_S = 60.0
"""How long a request waits for a store; long enough for a slow object store."""

_T = TypeVar("_T")


def call_store(call: Callable[[], _T], what: str, timeout_s: float | None = None) -> _T:
    """``call()``'s result or exception, if it comes within ``timeout_s`` (default
    ``STORE_TIMEOUT_S``).

    Raises:
        DeadlineExceeded: it did not; the message names ``what`` and what to check.
    """
    limit = STORE_TIMEOUT_S if timeout_s is None else timeout_s
    outcome: list[tuple[bool, object]] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name=f"weir-store-call: {what}"[:60], daemon=True).start()
    if not done.wait(limit):
        raise DeadlineExceeded(f"{what} did not answer within {limit:g} s; check that the "
                               "store (its endpoint, mount or file) is reachable, then retry")
    ok, value = outcome[0]
    if not ok:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]
