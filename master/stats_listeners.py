"""Operators' stats listeners in the master: loaded from the DAG, fed the partitions' stats.

The listener objects (``operators.scaling``) are user code: the master unpickles them at
submit (and again after a restart, from the journaled DAG), keeps them outside the
journaled application (they need not pickle with plain ``pickle``), and calls them outside
its lock; what they ask for goes through ``MasterCore.repartition`` like a request of
``weir repartition``.
"""

from __future__ import annotations

import logging

import cloudpickle

from master.application import Application
from master.views import operator_info
from operators.scaling import OperatorStats, PartitionStats, StatsListener
from proto import plan_pb2

__all__ = ["StatsListenerError", "load_listeners", "operator_stats"]

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
