"""An operator's window stats for the heartbeat: rows per port, bytes published, CPU and
user metrics of each window, kept until the heartbeat loop drains them."""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping

from weir.container.port_input import PortInput
from weir.container.runner_needs import Clock, Publisher
from weir.operators.dead_letters import METRIC
from weir.operators.metrics import collect_metrics
from weir.proto import umbilical_pb2
from weir.runtime.window_engine import WindowEngine

__all__ = ["WindowStats"]

_RING = 1024  # windows kept while no heartbeat drains them


class WindowStats:
    """One runner's completed windows, written by its thread, drained by the heartbeat's."""

    def __init__(self, publishers: Mapping[str, Publisher], inputs: Mapping[str, PortInput],
                 clock: Clock) -> None:
        self.publishers = publishers
        self.inputs = inputs
        self.clock = clock
        self.cpu_ns = 0  # the current window's, in the operator's thread
        self.begin_ms = 0  # when the current window began (the wall clock, epoch ms)
        self._ring: collections.deque[umbilical_pb2.OperatorStats] = collections.deque(
            maxlen=_RING)
        self._lock = threading.Lock()
        self._out_bytes = {p: pub.bytes_published for p, pub in publishers.items()}

    def record(self, engine: WindowEngine, stats: umbilical_pb2.OperatorStats) -> None:
        """Completes ``stats`` with the window's figures (the engine's row counts start
        over) and keeps it for the next heartbeat."""
        now = self.clock.now_ms()
        stats.cpu_time_used_ns = self.cpu_ns
        stats.begin_window_ms = self.begin_ms
        stats.metrics.update(collect_metrics(engine.operator))  # user metrics
        if engine.dead_letters is not None:
            stats.metrics[METRIC] = engine.dead_letters.count
        for port, count in engine.rows_in.items():
            stats.input_ports.add(id=port, tuple_count=count, end_window_timestamp=now,
                                  queue_size=self.inputs[port].queue_size,
                                  transport=self.inputs[port].transport)
        for port, count in engine.rows_out.items():
            published = self.publishers[port].bytes_published
            stats.output_ports.add(id=port, tuple_count=count, end_window_timestamp=now,
                                   buffer_server_bytes=published - self._out_bytes[port])
            self._out_bytes[port] = published
        engine.rows_in = dict.fromkeys(engine.rows_in, 0)
        engine.rows_out = dict.fromkeys(engine.rows_out, 0)
        self.keep(stats)

    def keep(self, stats: umbilical_pb2.OperatorStats) -> None:
        with self._lock:
            self._ring.append(stats)

    def drain(self) -> list[umbilical_pb2.OperatorStats]:
        """Window stats completed since the previous call."""
        with self._lock:
            stats = list(self._ring)
            self._ring.clear()
        return stats
