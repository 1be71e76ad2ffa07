"""Prometheus metrics of every application, read from the master at each scrape.

A custom collector (``prometheus_client``'s pattern for exporters): nothing is copied in
the background; each scrape builds the same messages ``weir`` shows (``master.views``),
taking the master's lock per application, never for the whole scrape, and turns them into
labelled metrics outside it. Times are in seconds and
sizes in bytes, as Prometheus expects. Window ids (64 bits, more than a float holds
exactly) are exported as their counter: windows since the application's start.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from weir.master.core import MasterCore
from weir.master.errors import NotFound
from weir.operators.watermarks import END_OF_TIME, NO_WATERMARK
from weir.operators.windows import window_counter
from weir.proto import client_pb2

__all__ = ["WeirCollector", "master_registry"]

_LOGGER = logging.getLogger(__name__)

_MB = 1024 * 1024
_APP = ["app", "name"]
_OPERATOR = ["app", "operator", "id", "container"]
_PORT = ["app", "operator", "id", "port", "type"]
_CONTAINER = ["app", "container", "host"]


def _window(window_id: int) -> int:
    return window_counter(window_id) if window_id >= 0 else -1


class _Families:
    """Metric families by name, created on first use, yielded in creation order."""

    def __init__(self) -> None:
        self._families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def gauge(self, name: str, doc: str, labels: list[str], values: list[str],
              value: float) -> None:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = GaugeMetricFamily(name, doc, labels=labels)
        family.add_metric(values, value)

    def counter(self, name: str, doc: str, labels: list[str], values: list[str],
                value: float) -> None:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = CounterMetricFamily(name, doc, labels=labels)
        family.add_metric(values, value)

    def __iter__(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        return iter(self._families.values())


class WeirCollector(Collector):
    """Every application's, operator's, port's and container's figures, at scrape time."""

    def __init__(self, core: MasterCore) -> None:
        self.core = core

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        families = _Families()
        core = self.core
        details = []
        for app in core.list_applications():  # the lock is held per call, never for all
            try:
                details.append((app, core.list_operators(app.id), core.list_containers(app.id)))
            except NotFound:
                continue  # forgotten meanwhile
        for app, operators, containers in details:
            _application(families, app)
            for op in operators:
                _operator(families, app, op)
            for container in containers:
                _container(families, app, container)
        yield from families


def _application(f: _Families, app: client_pb2.ApplicationInfo) -> None:
    labels = [app.id, app.name]
    f.gauge("weir_application_state", "1 for the application's state.", [*_APP, "state"],
            [*labels, app.state], 1)
    f.gauge("weir_application_containers", "Containers of the application that are ACTIVE.",
            _APP, labels, app.containers_active)
    f.gauge("weir_application_containers_planned", "Containers the application runs in.",
            _APP, labels, app.containers_planned)
    f.gauge("weir_application_operators", "Physical operators.", _APP, labels, app.operators)
    f.gauge("weir_application_operators_failed", "Physical operators FAILED.", _APP, labels,
            app.operators_failed)
    f.gauge("weir_application_operators_not_running", "Physical operators neither running "
            "windows nor ended: deploying, in setup, activating or recovering.", _APP, labels,
            app.operators_not_running)
    f.gauge("weir_application_stalled_since_seconds", "Since when no window committed while "
            "the sources emitted (Unix time; 0 = progressing): the progress watchdog.",
            _APP, labels, app.stalled_since_ms / 1000)
    f.counter("weir_application_tuples_processed", "Tuples processed by all operators.",
              _APP, labels, app.total_tuples_processed)
    f.counter("weir_application_tuples_emitted", "Tuples emitted by all operators.",
              _APP, labels, app.total_tuples_emitted)
    f.gauge("weir_application_tuples_processed_per_second",
            "Tuples processed per second by all operators (moving average).", _APP, labels,
            app.tuples_processed_per_second)
    f.gauge("weir_application_tuples_emitted_per_second",
            "Tuples emitted per second by all operators (moving average).", _APP, labels,
            app.tuples_emitted_per_second)
    f.gauge("weir_application_latency_seconds",
            "Latency along the critical path (the slowest source-to-sink path).", _APP, labels,
            app.latency_ms / 1000)
    f.gauge("weir_application_current_window", "Current window (counter since the start).",
            _APP, labels, _window(app.current_window_id))
    f.gauge("weir_application_committed_window",
            "Committed window (counter since the start); -1 = none yet.", _APP, labels,
            _window(app.committed_window_id))
    f.counter("weir_application_recoveries", "Containers lost and replaced.", _APP, labels,
              app.recoveries)
    f.counter("weir_application_operator_failures", "Failures of its operators.", _APP,
              labels, app.operator_failures)
    for logical in app.logical_operators:
        for metric, value in sorted(logical.metrics.items()):
            f.gauge("weir_operator_user_metric",
                    "A metric the operator declares (@metric / METRICS), summed over its "
                    "partitions.", ["app", "operator", "metric"], [app.id, logical.name, metric],
                    value)


def _operator(f: _Families, app: client_pb2.ApplicationInfo,
              op: client_pb2.OperatorInfo) -> None:
    labels = [app.id, op.name, str(op.id), op.container_id]
    f.gauge("weir_operator_state", "1 for the operator's state.", [*_OPERATOR, "state"],
            [*labels, op.state], 1)
    f.counter("weir_operator_tuples_processed", "Tuples the operator took in.", _OPERATOR,
              labels, op.total_tuples_processed)
    f.counter("weir_operator_tuples_emitted", "Tuples the operator emitted.", _OPERATOR,
              labels, op.total_tuples_emitted)
    f.gauge("weir_operator_tuples_processed_per_second", "Tuples in per second (moving "
            "average).", _OPERATOR, labels, op.tuples_processed_per_second)
    f.gauge("weir_operator_tuples_emitted_per_second", "Tuples out per second (moving "
            "average).", _OPERATOR, labels, op.tuples_emitted_per_second)
    f.gauge("weir_operator_cpu_percent", "CPU of the operator's thread; 100 = one core.",
            _OPERATOR, labels, op.cpu_percent)
    f.gauge("weir_operator_latency_seconds", "END_WINDOW here minus upstream's, averaged.",
            _OPERATOR, labels, op.latency_ms / 1000)
    f.counter("weir_operator_windows_processed", "Streaming windows processed.", _OPERATOR,
              labels, op.windows_processed)
    for name, window, doc in (
            ("current", op.current_window_id, "Current window"),
            ("recovery", op.recovery_window_id, "Recovery window (its recovery checkpoint)"),
            ("checkpoint", op.checkpoint_window_id, "Newest checkpointed window"),
            ("committed", op.committed_window_id, "Committed window")):
        f.gauge(f"weir_operator_{name}_window", f"{doc}, as a counter since the start; "
                "-1 = none.", _OPERATOR, labels, _window(window))
    f.gauge("weir_operator_checkpoint_duration_seconds", "How long its last checkpoint took.",
            _OPERATOR, labels, op.checkpoint_time_ms / 1000)
    f.gauge("weir_operator_checkpoint_bytes", "The size of its last checkpoint: its state.",
            _OPERATOR, labels, op.checkpoint_bytes)
    f.counter("weir_operator_failures", "Failures of the operator.", _OPERATOR, labels,
              op.failure_count)
    if op.watermark_ms != NO_WATERMARK:  # only operators that have one
        f.gauge("weir_operator_watermark_seconds", "Its watermark: the event time (Unix time) "
                "its input is complete up to; +Inf once every input ended.", _OPERATOR,
                labels, math.inf if op.watermark_ms == END_OF_TIME else op.watermark_ms / 1000)
        f.gauge("weir_operator_event_time_lag_seconds", "The wall clock minus its watermark "
                "(0 once every input ended).", _OPERATOR, labels, op.event_time_lag_ms / 1000)
    for port in op.ports:
        port_labels = [app.id, op.name, str(op.id), port.name, port.type]
        f.counter("weir_port_tuples", "Tuples through the port.", _PORT, port_labels,
                  port.total_tuples)
        f.gauge("weir_port_tuples_per_second", "Tuples per second through the port.", _PORT,
                port_labels, port.tuples_per_second)
        f.counter("weir_port_buffer_server_bytes", "Bytes the port moved through the buffer "
                  "server.", _PORT, port_labels, port.buffer_server_bytes)
        f.gauge("weir_port_buffer_server_bytes_per_second", "Buffer-server bytes per second.",
                _PORT, port_labels, port.buffer_server_bytes_per_second)
        f.gauge("weir_port_queue_size", "Messages waiting at an input port.", _PORT,
                port_labels, port.queue_size)


def _container(f: _Families, app: client_pb2.ApplicationInfo,
               c: client_pb2.ContainerInfo) -> None:
    labels = [app.id, c.id, c.host]
    f.gauge("weir_container_state", "1 for the container's state.", [*_CONTAINER, "state"],
            [*labels, c.state], 1)
    if c.state == "KILLED" or not c.heartbeats:
        return  # a dead (or silent) process has no current figures
    f.gauge("weir_container_cpu_percent", "CPU of the process and its children (Spark's "
            "JVM); 100 = one core.", _CONTAINER, labels, c.cpu_percent)
    f.gauge("weir_container_memory_rss_bytes", "Resident memory of the process and its "
            "children.", _CONTAINER, labels, c.memory_rss_mb * _MB)
    f.gauge("weir_container_memory_free_bytes", "Free memory of the container's host.",
            _CONTAINER, labels, c.memory_mb_free * _MB)
    f.counter("weir_container_gc_collections", "Collections of Python's garbage collector.",
              _CONTAINER, labels, c.gc_collection_count)
    f.counter("weir_container_gc_seconds", "Time spent in Python's garbage collector.",
              _CONTAINER, labels, c.gc_collection_time_ms / 1000)
    f.counter("weir_container_heartbeats", "Heartbeats received.", _CONTAINER, labels,
              c.heartbeats)
    f.gauge("weir_container_last_heartbeat_timestamp_seconds", "When its last heartbeat "
            "arrived (Unix time).", _CONTAINER, labels, c.last_heartbeat_ms / 1000)


def master_registry(core: MasterCore) -> CollectorRegistry:
    """A registry of the master's own: Weir's figures plus the master process's.

    Not the global default registry: several masters may live in one process (tests).
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WeirCollector(core))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry
