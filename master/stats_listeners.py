"""Operators' stats listeners in the master: loaded from the DAG, fed the partitions' stats.

The listener objects (``operators.scaling``) are user code: the master unpickles them at
submit (and again after a restart, from the journaled DAG), keeps them outside the
journaled application (they need not pickle with plain ``pickle``), and calls them outside
its lock; what they ask for goes through ``MasterCore.repartition`` like a request of
``weir repartition``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable

import cloudpickle

from weir.master.application import Application
from weir.master.repartition import Repartition, unhealthy
from weir.master.views import operator_info
from weir.operators.scaling import OperatorStats, PartitionStats, StatsListener
from weir.proto import plan_pb2

__all__ = ["ListenerAsk", "StatsListenerError", "StatsListeners", "consult", "load_listeners",
           "operator_stats"]

_LOGGER = logging.getLogger(__name__)


class StatsListenerError(ValueError):
    """A stats listener of the DAG cannot be loaded in the master."""


def load_listeners(dag: plan_pb2.DagDescriptor) -> dict[str, StatsListener]:
    """Operator name -> its stats listener, for the operators that have one.

    Raises:
        StatsListenerError: a listener cannot be unpickled here, or has no
            ``process_stats``.
    """
    listeners: dict[str, StatsListener] = {}
    for op in dag.operators:
        if not op.stats_listener_payload:
            continue
        try:
            listener = cloudpickle.loads(op.stats_listener_payload)
        except Exception as exc:  # noqa: BLE001 - any unpickling error is the user's to fix
            raise StatsListenerError(
                f"the stats listener of operator {op.name!r} ({op.stats_listener_class_name}) "
                f"cannot be loaded in the master: {type(exc).__name__}: {exc}; its class must "
                "be importable in the master or defined in the app file") from None
        if not callable(getattr(listener, "process_stats", None)):
            raise StatsListenerError(f"the stats listener of operator {op.name!r} has no "
                                     "process_stats(stats) method")
        listeners[op.name] = listener
    return listeners


def operator_stats(app: Application, operator: str, now_ms: int) -> OperatorStats:
    """The figures of every partition of ``operator`` (lock held), as ``weir operators``
    shows them."""
    partitions = []
    for op in app.plan.instances(operator):
        info = operator_info(app, op)
        partitions.append(PartitionStats(
            name=op.name, tuples_processed_per_second=info.tuples_processed_per_second,
            tuples_emitted_per_second=info.tuples_emitted_per_second,
            cpu_percent=info.cpu_percent, latency_ms=info.latency_ms,
            queue_size=sum(port.queue_size for port in info.ports if port.type == "input"),
            window_id=info.current_window_id))
    return OperatorStats(operator, now_ms, tuple(partitions))


@dataclasses.dataclass(frozen=True)
class ListenerAsk:
    """One listener to call outside the lock, with the stats it is to see."""

    app_id: str
    operator: str
    listener: StatsListener
    stats: OperatorStats


class StatsListeners:
    """Each application's stats listeners, by operator name (user code: never journaled)."""

    def __init__(self) -> None:
        self._by_app: dict[str, dict[str, StatsListener]] = {}

    def add(self, app_id: str, listeners: dict[str, StatsListener]) -> None:
        if listeners:
            self._by_app[app_id] = listeners

    def restore(self, app: Application, now_ms: int) -> None:
        """Loads a restored application's listeners from its DAG; one that cannot be
        loaded here is reported on the application, which runs on without them."""
        try:
            self.add(app.id, load_listeners(app.dag))
        except StatsListenerError as exc:
            app.report_error("master", str(exc), now_ms)
            _LOGGER.warning("app=%s restored without its stats listeners: %s", app.id, exc)

    def forget(self, app_id: str) -> None:
        self._by_app.pop(app_id, None)

    def asks(self, apps: Iterable[Application], now_ms: int) -> list[ListenerAsk]:
        """The listeners of healthy running applications with their stats (lock held)."""
        asks = []
        for app in apps:
            listeners = self._by_app.get(app.id)
            if not listeners or app.terminal or unhealthy(app) is not None:
                continue
            asks += [ListenerAsk(app.id, name, listener, operator_stats(app, name, now_ms))
                     for name, listener in listeners.items()]
        return asks


def consult(asks: Iterable[ListenerAsk],
            repartition: Callable[[ListenerAsk, int], Repartition | None],
            failed: Callable[[ListenerAsk, str], None]) -> list[Repartition]:
    """Calls each listener (outside the lock) and hands on what it asks for: at most one
    repartition per application and pass. ``repartition`` returns None when what the
    listener saw is stale by now; whatever raises is handed to ``failed``."""
    done: dict[str, Repartition] = {}
    for ask in asks:
        if ask.app_id in done:
            continue
        try:
            wanted = ask.listener.process_stats(ask.stats)
            if wanted is None or wanted == ask.stats.partition_count:
                continue
            result = repartition(ask, int(wanted))
            if result is not None:
                done[ask.app_id] = result
        except Exception as exc:  # noqa: BLE001 - user code, or a request refused
            failed(ask, f"{type(exc).__name__}: {exc}")
    return list(done.values())
