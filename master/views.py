"""The client API's messages built from the master's state (called under the master's lock)."""

from __future__ import annotations

import logging

from master.application import Application
from master.physical_plan import ContainerState, OperatorState, PTContainer, PTOperator
from master.recovery import max_restarts
from master.stats import latency_ms
from proto import client_pb2

__all__ = ["application_info", "container_info", "operator_info"]

_LOGGER = logging.getLogger(__name__)


def application_info(app: Application) -> client_pb2.ApplicationInfo:
    """Summary of one application: state, sizes, windows, failures and tuple totals."""
    ops = list(app.plan.operators.values())
    stats = app.operator_stats
    active_windows = [stats[op.id].current_window_id for op in ops
                      if op.state == OperatorState.ACTIVE and stats[op.id].current_window_id >= 0]
    all_windows = [stats[op.id].current_window_id for op in ops]
    current = min(active_windows) if active_windows else max(all_windows, default=-1)
    return client_pb2.ApplicationInfo(
        id=app.id, name=app.name, state=app.state.value, diagnostics=app.diagnostics,
        submitted_ms=app.submitted_ms, finished_ms=app.finished_ms,
        containers_planned=sum(not c.replaced_by for c in app.plan.containers.values()),
        containers_active=sum(c.state == ContainerState.ACTIVE
                              for c in app.plan.containers.values()),
        operators=len(ops),
        current_window_id=current,
        committed_window_id=app.committed_window_id,
        total_tuples_processed=sum(stats[op.id].total_tuples_processed for op in ops),
        total_tuples_emitted=sum(stats[op.id].total_tuples_emitted for op in ops),
        attributes=app.plan.attribute_text(),
        start_window_millis=app.start_window_millis,
        operators_failed=sum(op.state == OperatorState.FAILED for op in ops),
        recoveries=app.recoveries,
        operator_failures=sum(op.failure_count for op in ops),
        last_recovery=app.last_recovery, last_recovery_ms=app.last_recovery_ms,
        containers_replaced=sum(bool(c.replaced_by) for c in app.plan.containers.values()),
    )


def container_info(app: Application, container: PTContainer) -> client_pb2.ContainerInfo:
    """One container: state, process, buffer server and its last heartbeat's figures."""
    stats = app.container_stats[container.id]
    return client_pb2.ContainerInfo(
        id=container.id, application_id=app.id, state=container.state.value,
        process_name=stats.process_name,
        buffer_server_address=container.buffer_server_address,
        last_heartbeat_ms=stats.last_heartbeat_ms,
        operator_ids=container.operator_ids,
        cpu_percent=stats.cpu_percent, memory_rss_mb=stats.memory_rss_mb,
        memory_mb_free=stats.memory_mb_free,
        gc_collection_count=stats.gc_collection_count,
        gc_collection_time_ms=stats.gc_collection_time_ms,
        heartbeats=stats.heartbeats, started_ms=container.allocated_ms,
        finished_ms=container.finished_ms, diagnostics=container.diagnostics,
        replaces=container.replaces, replaced_by=container.replaced_by,
    )


def operator_info(app: Application, op: PTOperator, *, with_windows: bool = False
                  ) -> client_pb2.OperatorInfo:
    """One operator's state and statistics; ``with_windows`` adds the recent windows."""
    tracker = app.operator_stats[op.id]
    book = app.checkpoints[op.id]
    upstream = [app.operator_stats[i] for i in app.plan.upstream_ids(op.id)]
    info = client_pb2.OperatorInfo(
        id=op.id, name=op.name, application_id=app.id, container_id=op.container_id,
        class_name=op.class_name, state=op.state.value,
        current_window_id=tracker.current_window_id,
        total_tuples_processed=tracker.total_tuples_processed,
        total_tuples_emitted=tracker.total_tuples_emitted,
        tuples_processed_per_second=tracker.tuples_processed_per_second,
        tuples_emitted_per_second=tracker.tuples_emitted_per_second,
        cpu_percent=tracker.cpu_percent, failure_count=op.failure_count,
        recovery_window_id=op.recovery_window_id, last_heartbeat_ms=tracker.last_heartbeat_ms,
        error=op.error, windows_processed=tracker.windows_processed,
        latency_ms=latency_ms(tracker, upstream),
        checkpoint_window_id=book.latest, checkpoint_time_ms=book.last_time_ms,
        checkpoint_time_avg_ms=book.average_time_ms, checkpoints=book.count,
        failures_in_a_row=op.failures_in_a_row, max_restarts=max_restarts(op),
        deploy_window_id=op.deploy_window_id, processing_mode=op.processing_mode,
    )
    keys = [("input", link.port_name) for link in op.inputs]
    keys += [("output", link.port_name) for link in op.outputs]
    keys += sorted(key for key in tracker.ports if key not in keys)
    for kind, name in dict.fromkeys(keys):
        port = tracker.ports.get((kind, name))
        if port is None:
            info.ports.add(name=name, type=kind)
            continue
        info.ports.add(name=name, type=kind, total_tuples=port.total_tuples,
                       tuples_per_second=port.tuples_per_second,
                       buffer_server_bytes=port.buffer_server_bytes, queue_size=port.queue_size)
    if with_windows:
        for window in tracker.recent:
            info.recent_windows.add(
                window_id=window.window_id, tuples_processed=window.tuples_processed,
                tuples_emitted=window.tuples_emitted, end_window_ms=window.end_window_ms,
                cpu_time_ns=window.cpu_time_ns)
    return info
