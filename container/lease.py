"""The container's lease: it acts only while the master cannot have given up on it.

The master declares a container lost once it has heard nothing from it for
``HEARTBEAT_TIMEOUT_MILLIS`` and hands its operators to a replacement. A heartbeat sent at
``t`` and answered with anything but ABORT proves the master had not given up at ``t``
and will not before ``t + timeout`` (it counts from when the heartbeat arrived, which is
later). So operators begin windows, checkpoint and commit only within that span, less a
margin for clocks that run at slightly different rates. A container frozen past it
(SIGSTOP, a long GC-like pause, a network cut) finds its lease expired when it wakes: its
operators wait for the next answer, which is ABORT if it was replaced, and write nothing
meanwhile. The operators' fences (``storage.fence``) refuse any write that was
already under way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["LEASE_FRACTION", "Lease", "LeaseRevoked"]

_LOGGER = logging.getLogger(__name__)

LEASE_FRACTION = 0.8
"""The share of the heartbeat timeout a lease lasts: the rest is the margin."""


class LeaseRevoked(RuntimeError):
    """The master answered ABORT: this container was replaced (or its application ended)."""


class Lease:
    """Renewed by each accepted heartbeat; ``wait`` blocks an operator while it has lapsed.

    Args:
        timeout_ms: the application's ``HEARTBEAT_TIMEOUT_MILLIS``.
        clock: monotonic seconds (tests step it by hand).
    """

    def __init__(self, timeout_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.duration_s = timeout_ms / 1000 * LEASE_FRACTION
        self._clock = clock
        self._cond = threading.Condition()
        self._expires = clock() + self.duration_s  # the init context was just answered
        self._revoked = False

    def renew(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` (this clock) was accepted."""
        with self._cond:
            self._expires = max(self._expires, sent_at + self.duration_s)
            self._cond.notify_all()

    def revoke(self) -> None:
        """The master said ABORT: nothing may be done any more."""
        with self._cond:
            self._revoked = True
            self._cond.notify_all()

    @property
    def valid(self) -> bool:
        with self._cond:
            return not self._revoked and self._clock() < self._expires

    def wait(self, stopped: threading.Event, poll_s: float = 0.05) -> None:
        """Returns once the lease holds; blocks while it has lapsed.

        Raises:
            LeaseRevoked: the master said ABORT, or ``stopped`` was set while waiting.
        """
        waited = False
        with self._cond:
            while True:
                if self._revoked:
                    raise LeaseRevoked("the master gave up on this container; it writes "
                                       "nothing more")
                if stopped.is_set():
                    raise LeaseRevoked("the operator is stopping")
                if self._clock() < self._expires:
                    break
                if not waited:
                    _LOGGER.warning("lease lapsed (no heartbeat accepted for %.1f s): "
                                    "operators wait for the master's answer",
                                    self.duration_s)
                    waited = True
                self._cond.wait(poll_s)
        if waited:
            _LOGGER.warning("lease renewed: operators go on")
