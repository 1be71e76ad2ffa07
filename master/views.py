"""The client API's messages built from the master's state (called under the master's lock).

One source of truth for every way of looking at a running application: the gRPC client
API (``weir``), the HTTP JSON API and dashboard (``master.http_api``) and the Prometheus
collector (``master.metrics``) all read these messages.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from weir.master import spares
from weir.master.application import Application
from weir.master.errors import NotFound, shown
from weir.master.physical_plan import ContainerState, OperatorState, PTContainer, PTOperator
from weir.master.recovery import max_restarts
from weir.master.stats import event_time_lag_ms, latency_ms, window_latency_ms
from weir.operators.attributes import ATTRIBUTES
from weir.proto import client_pb2
from weir.storage.locations import redact_location

__all__ = ["application_info", "application_plan", "container_info", "find_operator",
           "operator_info", "operator_infos"]

_LOGGER = logging.getLogger(__name__)

_INTERVAL = "THROUGHPUT_CALCULATION_INTERVAL_MILLIS"
_FAILURES_SHOWN = 20


@dataclasses.dataclass(frozen=True)
class _Figures:
    """One operator's moving averages, computed once per view."""

    processed_per_second: float
    emitted_per_second: float
    cpu_percent: float
    latency_ms: float


def _interval_ms(app: Application) -> int:
    return int(app.plan.attributes.get(_INTERVAL, ATTRIBUTES[_INTERVAL].default))


def _figures(app: Application, op: PTOperator, now_ms: int) -> _Figures:
    """Its rates over the last interval of its windows, and its latency; none for an
    operator that does not run now (not ACTIVE, or no window for a heartbeat timeout):
    its last windows' rates would say it still moves."""
    tracker = app.operator_stats[op.id]
    interval = _interval_ms(app)
    upstream = [app.operator_stats[i] for i in app.plan.upstream_ids(op.id)]
    if op.state != OperatorState.ACTIVE or (
            now_ms - tracker.window_moved_ms > max(interval, app.heartbeat_timeout_ms)):
        return _Figures(0.0, 0.0, 0.0, latency_ms(tracker, upstream, interval))
    processed, emitted, cpu = tracker.rates(interval)
    return _Figures(processed, emitted, cpu, latency_ms(tracker, upstream, interval))


def _now_ms(now_ms: int | None) -> int:
    """The time event-time lags are measured at: the master's clock, or the wall clock."""
    return time.time_ns() // 1_000_000 if now_ms is None else now_ms


def _logical_name(op: PTOperator) -> str:
    """The logical operator a partition (or unifier) belongs to: ``PTOperator.logical_name``."""
    return str(getattr(op, "logical_name", "") or op.name)


def application_info(app: Application, dashboard_url: str = "", now_ms: int | None = None,
                     *, brief: bool = False) -> client_pb2.ApplicationInfo:
    """Summary of one application: state, sizes, windows, failures, totals, rates, latency;
    ``now_ms`` is the time event-time lags are measured at (the wall clock if None).
    ``brief``: without the figures derived per operator (rates, latency, logical
    operators, recent failures): what a watch polling every second needs, at a fraction
    of the cost (profiled: 21 % of an application master's CPU went to the dispatcher's
    watch asking for all of them every second)."""
    ops = list(app.plan.operators.values())
    stats = app.operator_stats
    figures = {} if brief else {op.id: _figures(app, op, _now_ms(now_ms)) for op in ops}
    active_windows = [stats[op.id].current_window_id for op in ops
                      if op.state == OperatorState.ACTIVE and stats[op.id].current_window_id >= 0]
    all_windows = [stats[op.id].current_window_id for op in ops]
    current = min(active_windows) if active_windows else max(all_windows, default=-1)
    path_latency, path = (0.0, []) if brief else _critical_path(app, figures)
    info = client_pb2.ApplicationInfo(
        id=app.id, name=app.name, state=app.state.value, diagnostics=app.diagnostics,
        submitted_ms=app.submitted_ms, finished_ms=app.finished_ms,
        containers_planned=sum(not c.replaced_by for c in app.plan.containers.values()),
        containers_active=sum(c.state == ContainerState.ACTIVE
                              for c in app.plan.containers.values()),
        operators=len(ops),
        current_window_id=current,
        committed_window_id=app.committed_window_id,
        # totals count what operators a repartition retired did too: counters never go back
        total_tuples_processed=sum(stats[op.id].total_tuples_processed
                                   for op in [*ops, *app.plan.retired.values()]),
        total_tuples_emitted=sum(stats[op.id].total_tuples_emitted
                                 for op in [*ops, *app.plan.retired.values()]),
        attributes={name: redact_location(value)  # STATE_DIR may be s3://KEY:SECRET@…
                    for name, value in app.plan.attribute_text().items()},
        start_window_millis=app.start_window_millis,
        operators_failed=sum(op.state == OperatorState.FAILED for op in ops),
        operators_not_running=sum(_not_running(op) for op in ops),
        recoveries=app.recoveries,
        operator_failures=sum(op.failure_count for op in ops),
        last_recovery=app.last_recovery, last_recovery_ms=app.last_recovery_ms,
        containers_replaced=sum(bool(c.replaced_by) for c in app.plan.containers.values()),
        tuples_processed_per_second=sum(f.processed_per_second for f in figures.values()),
        tuples_emitted_per_second=sum(f.emitted_per_second for f in figures.values()),
        latency_ms=path_latency, critical_path=path, dashboard_url=dashboard_url,
        from_savepoint=redact_location(app.from_savepoint),
        savepoint_path=redact_location(app.savepoint.path) if app.savepoint is not None else "",
        savepoint_state=app.savepoint.state if app.savepoint is not None else "",
        repartitions=app.repartitions, last_repartition=app.last_repartition,
        restart_at_ms=app.restart_at_ms, restart_delay_ms=app.restart_delay_ms,
        stalled_since_ms=app.stalled_since_ms,
        containers_spare=sum(c.spare for c in app.plan.live_containers()),
    )
    if not brief:
        _add_logical_operators(app, figures, info, _now_ms(now_ms))
        info.recent_failures.extend(_recent_failures(app))
    return info


def _not_running(op: PTOperator) -> bool:
    """Neither running windows nor ended: deployed or not yet, in setup, activating, or
    redeployed with no window finished yet."""
    if op.terminal:
        return False
    return op.state != OperatorState.ACTIVE or not op.ready or op.activating or op.recovering


def _critical_path(app: Application, figures: dict[int, _Figures]) -> tuple[float, list[str]]:
    """The slowest source-to-sink path: its summed operator latencies and operator names.

    One pass in topological order sees every upstream operator before its downstream ones.
    """
    best: dict[int, tuple[float, int | None]] = {}  # id -> (path latency, previous id)
    for op_id in app.plan.topological_ids():
        upstream = [(best[u][0], u) for u in app.plan.upstream_ids(op_id) if u in best]
        before, previous = max(upstream) if upstream else (0.0, None)
        best[op_id] = (before + figures[op_id].latency_ms, previous)
    if not best:
        return 0.0, []
    end = max(best, key=lambda i: (best[i][0], i))
    total, path, cursor = best[end][0], [], end
    while cursor is not None:
        path.append(app.plan.operators[cursor].name)
        cursor = best[cursor][1]
    return total, path[::-1]


def _add_logical_operators(app: Application, figures: dict[int, _Figures],
                           info: client_pb2.ApplicationInfo, now_ms: int) -> None:
    """One entry per logical operator, its partitions' figures added up (its watermark:
    the lowest of theirs, how far the whole operator is complete)."""
    groups: dict[str, list[PTOperator]] = {}
    for op in app.plan.operators.values():
        groups.setdefault(_logical_name(op), []).append(op)
    retired: dict[str, list[PTOperator]] = {}
    for op in app.plan.retired.values():
        retired.setdefault(_logical_name(op), []).append(op)
    for name, partitions in groups.items():
        trackers = [app.operator_stats[op.id] for op in partitions]
        # totals count what partitions a repartition retired did too
        totals = trackers + [app.operator_stats[op.id] for op in retired.get(name, [])]
        metrics: dict[str, float] = {}
        for tracker in trackers:
            for key, value in tracker.metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value
        watermark = min(t.watermark_ms for t in trackers)
        info.logical_operators.add(
            name=name, class_name=partitions[0].class_name,
            partition_ids=[op.id for op in partitions],
            total_tuples_processed=sum(t.total_tuples_processed for t in totals),
            total_tuples_emitted=sum(t.total_tuples_emitted for t in totals),
            tuples_processed_per_second=sum(figures[op.id].processed_per_second
                                            for op in partitions),
            tuples_emitted_per_second=sum(figures[op.id].emitted_per_second
                                          for op in partitions),
            latency_ms=max(figures[op.id].latency_ms for op in partitions),
            metrics=metrics, watermark_ms=watermark,
            event_time_lag_ms=event_time_lag_ms(watermark, now_ms),
            checkpoint_bytes=sum(app.checkpoints[op.id].last_bytes for op in partitions))


def _recent_failures(app: Application) -> list[client_pb2.FailureInfo]:
    """Lost containers, failed operators and reported errors, newest first."""
    failures = [client_pb2.FailureInfo(time_ms=c.finished_ms, kind="container", subject=c.id,
                                       message=c.diagnostics or "lost")
                for c in app.plan.containers.values()
                if c.state == ContainerState.KILLED and c.diagnostics and not c.ended_with_app]
    failures += [client_pb2.FailureInfo(
        time_ms=op.error_ms or app.operator_stats[op.id].last_heartbeat_ms, kind="operator",
        subject=op.name,
        message=f"{op.error} (failures: {op.failure_count})") for op in app.plan.operators.values()
        if op.error]
    failures += [client_pb2.FailureInfo(time_ms=e.time_ms, kind="error", subject=e.source,
                                        message=e.message) for e in reversed(app.reported_errors)]
    failures.sort(key=lambda f: -f.time_ms)  # (stable: of equal times, the newest report first)
    return failures[:_FAILURES_SHOWN]


def container_info(app: Application, container: PTContainer) -> client_pb2.ContainerInfo:
    """One container: state, process, buffer server and its last heartbeat's figures."""
    stats = app.container_stats[container.id]
    return client_pb2.ContainerInfo(
        id=container.id, application_id=app.id, state=_shown_state(app, container),
        process_name=stats.process_name,
        buffer_server_address=container.buffer_server_address,
        last_heartbeat_ms=stats.last_heartbeat_ms,
        operator_ids=[i for i in container.operator_ids if i not in app.plan.retired],
        cpu_percent=stats.cpu_percent, memory_rss_mb=stats.memory_rss_mb,
        memory_mb_free=stats.memory_mb_free,
        gc_collection_count=stats.gc_collection_count,
        gc_collection_time_ms=stats.gc_collection_time_ms,
        heartbeats=stats.heartbeats, started_ms=container.allocated_ms,
        finished_ms=container.finished_ms, diagnostics=container.diagnostics,
        replaces=container.replaces, replaced_by=container.replaced_by,
        host=stats.host, spare=container.spare, spark_warm=container.spark_warm,
        buffer_memory_limit_bytes=stats.buffer_memory_limit_bytes,
        buffer_memory_bytes=stats.buffer_memory_bytes, buffer_disk_bytes=stats.buffer_disk_bytes,
        buffer_blocks_spilled=stats.buffer_blocks_spilled,
    )


def _shown_state(app: Application, container: PTContainer) -> str:
    """The state users see: a live spare is SPARE once it can take over, else
    SPARE_STARTING (launched, or its Spark still warming up)."""
    if not container.spare or container.state == ContainerState.KILLED:
        return container.state.value
    return "SPARE" if spares.is_ready(app, container) else "SPARE_STARTING"


def operator_infos(app: Application, now_ms: int | None = None
                   ) -> list[client_pb2.OperatorInfo]:
    """Every operator of ``app`` in id order, without recent windows."""
    now_ms = _now_ms(now_ms)
    return [operator_info(app, op, now_ms=now_ms) for op in app.plan.operators.values()]


def find_operator(app: Application, operator: str) -> PTOperator:
    """The operator a user names: by name or physical id.

    Raises:
        NotFound: no such operator; a partitioned operator's logical name names its
            partitions in the message.
    """
    op = app.plan.operator_by_name(operator)
    if op is None and operator.strip().isdecimal():
        op = app.plan.operators.get(int(operator))
    if op is not None:
        return op
    partitions = [o.name for o in app.plan.operators.values() if o.logical_name == operator]
    if partitions:
        raise NotFound(f"operator {shown(operator)} of application {app.id} runs as partitions "
                       f"{partitions}; name one of them")
    raise NotFound(f"application {app.id} has no operator {shown(operator)}; "
                   f"`weir operators {app.id}` lists them")


def operator_info(app: Application, op: PTOperator, *, with_windows: bool = False,
                  now_ms: int | None = None) -> client_pb2.OperatorInfo:
    """One operator's state and statistics; ``with_windows`` adds the recent windows;
    ``now_ms`` is the time its event-time lag is measured at (the wall clock if None)."""
    tracker = app.operator_stats[op.id]
    book = app.checkpoints[op.id]
    figures = _figures(app, op, _now_ms(now_ms))
    info = client_pb2.OperatorInfo(
        id=op.id, name=op.name, application_id=app.id, container_id=op.container_id,
        class_name=op.class_name, state=op.shown_state,
        current_window_id=tracker.current_window_id,
        total_tuples_processed=tracker.total_tuples_processed,
        total_tuples_emitted=tracker.total_tuples_emitted,
        tuples_processed_per_second=figures.processed_per_second,
        tuples_emitted_per_second=figures.emitted_per_second,
        cpu_percent=figures.cpu_percent, failure_count=op.failure_count,
        recovery_window_id=op.recovery_window_id, last_heartbeat_ms=tracker.last_heartbeat_ms,
        error=op.error, windows_processed=tracker.windows_processed,
        latency_ms=figures.latency_ms,
        checkpoint_window_id=book.latest, checkpoint_time_ms=book.last_time_ms,
        checkpoint_time_avg_ms=book.average_time_ms, checkpoints=book.count,
        checkpoint_bytes=book.last_bytes,
        failures_in_a_row=op.failures_in_a_row, max_restarts=max_restarts(op),
        deploy_window_id=op.deploy_window_id, processing_mode=op.processing_mode,
        generation=op.generation, set_up_ms=op.set_up_ms, activated_ms=op.activated_ms,
        committed_window_id=app.committed_window_id, metrics=tracker.metrics,
        logical_name=_logical_name(op), watermark_ms=tracker.watermark_ms,
        event_time_lag_ms=event_time_lag_ms(tracker.watermark_ms, _now_ms(now_ms)),
    )
    interval = _interval_ms(app)
    keys = [("input", link.port_name) for link in op.inputs]
    keys += [("output", link.port_name) for link in op.outputs]
    keys += sorted(key for key in tracker.ports if key not in keys)
    for kind, name in dict.fromkeys(keys):
        port = tracker.ports.get((kind, name))
        if port is None:
            info.ports.add(name=name, type=kind)
            continue
        tuples_per_second, bytes_per_second = port.rates(interval)
        info.ports.add(name=name, type=kind, total_tuples=port.total_tuples,
                       tuples_per_second=tuples_per_second,
                       buffer_server_bytes=port.buffer_server_bytes, queue_size=port.queue_size,
                       buffer_server_bytes_per_second=bytes_per_second,
                       transport=port.transport)
    if with_windows:
        upstream = [app.operator_stats[i] for i in app.plan.upstream_ids(op.id)]
        for window in tracker.recent:
            latency = window_latency_ms(window, upstream)
            info.recent_windows.add(
                window_id=window.window_id, tuples_processed=window.tuples_processed,
                tuples_emitted=window.tuples_emitted, end_window_ms=window.end_window_ms,
                cpu_time_ns=window.cpu_time_ns, latency_ms=-1 if latency is None else latency,
                metrics=window.metrics or {}, begin_window_ms=window.begin_window_ms)
    return info


def application_plan(app: Application, now_ms: int | None = None
                     ) -> client_pb2.ApplicationPlan:
    """The DAG as deployed: operators and the streams between them, for drawing it."""
    now_ms = _now_ms(now_ms)
    plan = client_pb2.ApplicationPlan(  # in topological order: the dashboard lays them out
        application_id=app.id,
        operators=[operator_info(app, app.plan.operators[i], now_ms=now_ms)
                   for i in app.plan.topological_ids()])
    interval = _interval_ms(app)
    for op in app.plan.operators.values():
        tracker = app.operator_stats[op.id]
        for link in op.inputs:
            port = tracker.ports.get(("input", link.port_name))
            plan.streams.add(name=link.stream_name, source_operator_id=link.source_operator_id,
                             source_port=link.source_port_name, sink_operator_id=op.id,
                             sink_port=link.port_name,
                             tuples_per_second=port.rates(interval)[0] if port else 0.0)
    return plan
