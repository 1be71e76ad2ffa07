"""The master loop's second pass: every stats listener sees its operator's figures.

The listeners are user code, called outside the master's lock (``stats_listeners``); what
one asks for is checked again under the lock (it may be stale by then) and goes through
``MasterCore.repartition`` like a request of ``weir repartition``. A listener that
raises, or asks for what cannot be done, is recorded on its application, rate-limited.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from weir.master.app_registry import AppRegistry
from weir.master.repartition import Repartition, unhealthy
from weir.master.stats_listeners import ListenerAsk, StatsListeners, consult

__all__ = ["ListenerPass"]

_LOGGER = logging.getLogger(__name__)

Repartitioner = Callable[[str, str, int, str], Repartition]
"""(application id, operator, partitions, cause) -> the repartition done."""


class ListenerPass:
    """One pass over every healthy application's stats listeners."""

    def __init__(self, listeners: StatsListeners, apps: AppRegistry, lock: threading.RLock,
                 clock: Callable[[], int], repartition: Repartitioner) -> None:
        self._listeners = listeners
        self._apps = apps
        self._lock = lock
        self._clock = clock
        self._repartition = repartition

    def __call__(self) -> list[Repartition]:
        """Feeds every listener its operator's stats; returns the repartitions asked for."""
        with self._lock:
            asks = self._listeners.asks(self._apps.all(), self._clock())
        return consult(asks, self._asked, self._failed)

    def _asked(self, ask: ListenerAsk, wanted: int) -> Repartition | None:
        """A listener's request, unless what it saw is stale by now (then it asks again)."""
        with self._lock:
            app = self._apps.find(ask.app_id)
            if app is None or unhealthy(app) is not None or \
                    len(app.plan.instances(ask.operator)) != ask.stats.partition_count:
                return None
            return self._repartition(
                ask.app_id, ask.operator, wanted,
                f"asked by its stats listener {type(ask.listener).__name__}")

    def _failed(self, ask: ListenerAsk, error: str) -> None:
        with self._lock:
            app = self._apps.find(ask.app_id)
            if app is None:  # forgotten meanwhile
                return
            message = f"the stats listener of {ask.operator!r}: {error}"
            app.report_error("master", message, self._clock())
            app.log_limits.log(_LOGGER, logging.WARNING, ("stats listener", ask.operator),
                               self._clock(), "app=%s %s", ask.app_id, message)
