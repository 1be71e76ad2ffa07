"""Statistics the master accumulates from heartbeats, to answer ``weir operators`` and ``stats``.

Pure bookkeeping: trackers take the heartbeat messages and the time they arrived; rates
are computed over the recent windows' END_WINDOW timestamps, so they follow the
operator's own pace rather than the heartbeat's.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from weir.master.report_filter import PortFigures, ReportedWindow
from weir.operators.watermarks import END_OF_TIME, NO_WATERMARK
from weir.proto import umbilical_pb2

__all__ = [
    "RECENT_WINDOWS",
    "ContainerStatsTracker",
    "OperatorStatsTracker",
    "PortTotals",
    "WindowRecord",
    "event_time_lag_ms",
    "latency_ms",
    "window_latency_ms",
]

_LOGGER = logging.getLogger(__name__)

RECENT_WINDOWS = 100
"""How many recent windows each operator keeps (the ``weir stats`` ring)."""

class WindowRecord(NamedTuple):
    """One streaming window of one operator, as reported in a heartbeat.

    The tracker keeps them as plain tuples (``OperatorStatsTracker.window_ring``): the
    master holds ``RECENT_WINDOWS`` per operator, and CPython leaves plain tuples of
    numbers out of the garbage collector's walks, which would otherwise pause the master
    (and every heartbeat) in proportion to the windows it keeps.
    """

    window_id: int
    tuples_processed: int
    tuples_emitted: int
    end_window_ms: int
    cpu_time_ns: int
    metrics: dict[str, float] | None = None  # user metrics at the window's end, if any
    begin_window_ms: int = 0  # when it began in its container; 0 = not known


_ID, _PROCESSED, _EMITTED, _END, _CPU = range(5)  # WindowRecord's fields in the ring


def _within(points: Sequence[tuple[int, ...]], interval_ms: int | None
            ) -> Sequence[tuple[int, ...]]:
    """The points of the last ``interval_ms`` before the newest one (all if None)."""
    if interval_ms is None or len(points) < 2:
        return points
    since = points[-1][0] - interval_ms
    recent = [point for point in points if point[0] > since]
    # the point just before the interval opens it, so a window-long interval has a rate
    first = len(points) - len(recent)
    return [points[first - 1], *recent] if first > 0 else recent


def _rate_per_second(points: Sequence[tuple[int, ...]], interval_ms: int | None = None,
                     column: int = 1) -> float:
    """Sum of the values (``point[column]``) after the first point over the time the
    points (``point[0]``) span, per second.

    A moving average: with ``interval_ms``, only over the points of that last interval.
    """
    points = _within(points, interval_ms)
    if len(points) < 2:
        return 0.0
    span_ms = points[-1][0] - points[0][0]
    if span_ms <= 0:
        return 0.0
    return sum(point[column] for point in list(points)[1:]) * 1000.0 / span_ms


@dataclasses.dataclass
class PortTotals:
    """Totals of one port over the application's life, and its recent pace."""

    name: str
    type: str  # "input" or "output"
    total_tuples: int = 0
    buffer_server_bytes: int = 0
    queue_size: int = 0
    #: an input's last reported transport: "local" (upstream in its container) or "flight"
    transport: str = ""
    #: per recent window: (END_WINDOW ms, tuples, buffer-server bytes); one small tuple
    #: a window, as the master keeps one ring per port of every operator
    recent: collections.deque[tuple[int, int, int]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=RECENT_WINDOWS))

    def __getstate__(self) -> dict[str, object]:
        """Without the recent-window ring (see ``OperatorStatsTracker.__getstate__``)."""
        return {**self.__dict__, "recent": collections.deque(maxlen=RECENT_WINDOWS)}

    def __setstate__(self, state: dict[str, object]) -> None:
        state.pop("recent_bytes", None)  # a journal written before the rings were merged
        self.__dict__.update(state)

    @property
    def tuples_per_second(self) -> float:
        return _rate_per_second(self.recent)

    def rates(self, interval_ms: int | None = None) -> tuple[float, float]:
        """(tuples/s, buffer-server bytes/s) over the last ``interval_ms``."""
        return (_rate_per_second(self.recent, interval_ms, column=1),
                _rate_per_second(self.recent, interval_ms, column=2))


class OperatorStatsTracker:
    """Per-operator totals, recent windows and rates; one per physical operator.

    Windows at or before the current window are ignored, so a heartbeat sent twice
    (or a window replayed after a recovery) does not count twice. Liveness looks at
    ``last_window_id`` instead: the newest window of the operator's current instance,
    replayed or not, and ``window_moved_ms``, when it last moved.
    """

    def __init__(self) -> None:
        self.total_tuples_processed = 0
        self.total_tuples_emitted = 0
        self.current_window_id = -1
        self.windows_processed = 0
        self.last_heartbeat_ms = 0
        self.last_window_id = -1
        self.window_moved_ms = 0
        self.ports: dict[tuple[str, str], PortTotals] = {}
        self.metrics: dict[str, float] = {}  # user metrics as of the newest window
        self.watermark_ms = NO_WATERMARK  # as of the newest window (operators.watermarks)
        # the recent windows as plain tuples (``WindowRecord``'s fields): unlike objects,
        # tuples of numbers drop out of the garbage collector's walks
        self.window_ring: collections.deque[tuple[Any, ...]] = collections.deque(
            maxlen=RECENT_WINDOWS)

    def __getstate__(self) -> dict[str, object]:
        """Totals, not history: without the recent-window rings (its own and its ports'),
        each port's totals as a plain tuple (the master's journal pickles this at every
        checkpoint of every operator: profiled, the rings were most of it)."""
        state = dict(self.__dict__)
        state["window_ring"] = None
        state["ports"] = [(kind, name, t.total_tuples, t.buffer_server_bytes, t.queue_size,
                           t.transport) for (kind, name), t in self.ports.items()]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.pop("_end_window_ms", None)  # a journal written when it was kept apart
        state.pop("recent", None)  # a journal written when the ring held objects
        state["window_ring"] = collections.deque(maxlen=RECENT_WINDOWS)
        state.setdefault("watermark_ms", NO_WATERMARK)  # a journal from before watermarks
        ports = state.get("ports") or {}
        if isinstance(ports, list):  # (kind, name, tuples, bytes, queue, transport) each
            ports = {(kind, name): PortTotals(name, kind, tuples, sent, queue, how)
                     for kind, name, tuples, sent, queue, how in ports}
        else:  # a journal that kept whole PortTotals: their rings start over
            for totals in ports.values():
                totals.recent = collections.deque(maxlen=RECENT_WINDOWS)
        state["ports"] = ports
        self.__dict__.update(state)

    def record(self, windows: Sequence[ReportedWindow], now_ms: int) -> int:
        """Adds a report's windows (``report_filter.read_windows``); returns how many were
        new."""
        self.last_heartbeat_ms = now_ms
        added = 0
        for window in windows:
            window_id = window.window_id
            if window_id > self.last_window_id:
                self.last_window_id = window_id
                self.window_moved_ms = now_ms
            if window_id > self.current_window_id:
                self._record_window(window)
                added += 1
        return added

    def _record_window(self, window: ReportedWindow) -> None:
        # Runs for every window of every operator in every heartbeat: kept lean.
        processed, in_end = self._record_ports("input", window.inputs)
        emitted, out_end = self._record_ports("output", window.outputs)
        end_ms = max(in_end, out_end)
        self.total_tuples_processed += processed
        self.total_tuples_emitted += emitted
        self.current_window_id = window.window_id
        self.watermark_ms = window.watermark_ms
        self.windows_processed += 1
        if window.metrics:
            self.metrics = window.metrics
        self.window_ring.append((window.window_id, processed, emitted, end_ms,
                                 window.cpu_time_ns, window.metrics, window.begin_window_ms))

    def _record_ports(self, kind: str, figures: Sequence[PortFigures]) -> tuple[int, int]:
        """Adds one window's figures to each port's totals and ring; returns the tuples
        and the latest END_WINDOW over them."""
        ports = self.ports
        tuples = end_ms = 0
        for name, count, sent, end, queue, transport in figures:
            totals = ports.get((kind, name)) or self._port(kind, name)
            totals.total_tuples += count
            totals.buffer_server_bytes += sent
            totals.queue_size = queue
            if transport:
                totals.transport = transport
            totals.recent.append((end, count, sent))
            tuples += count
            if end > end_ms:
                end_ms = end
        return tuples, end_ms

    @property
    def recent(self) -> list[WindowRecord]:
        """The recent windows, oldest first."""
        return [WindowRecord._make(window) for window in self.window_ring]

    def _port(self, kind: str, name: str) -> PortTotals:
        totals = self.ports[(kind, name)] = PortTotals(name, kind)
        return totals

    def restarted(self, now_ms: int) -> None:
        """A new instance of the operator is on its way: its own windows start over."""
        self.last_window_id = -1
        self.window_moved_ms = now_ms

    def end_window_ms(self, window_id: int) -> int | None:
        """When END_WINDOW of ``window_id`` passed this operator (epoch ms), if it is one
        of the recent windows (asked for a downstream operator's latency: its windows
        are at most as new as these)."""
        for window in reversed(self.window_ring):  # ids ascend: the newest are asked most
            if window[_ID] <= window_id:
                return (window[_END] or None) if window[_ID] == window_id else None
        return None

    @property
    def tuples_processed_per_second(self) -> float:
        return self.rates()[0]

    @property
    def tuples_emitted_per_second(self) -> float:
        return self.rates()[1]

    @property
    def cpu_percent(self) -> float:
        """CPU of the operator's thread over the recent windows; 100 = one core."""
        return self.rates()[2]

    def rates(self, interval_ms: int | None = None) -> tuple[float, float, float]:
        """(processed/s, emitted/s, CPU %) as moving averages over the last ``interval_ms``
        of windows (every recent window if None)."""
        recent = _last_windows(self.window_ring, interval_ms, opening=True)
        processed = _rate_per_second([(w[_END], w[_PROCESSED]) for w in recent])
        emitted = _rate_per_second([(w[_END], w[_EMITTED]) for w in recent])
        cpu_ns = _rate_per_second([(w[_END], w[_CPU]) for w in recent])
        return processed, emitted, cpu_ns / 1e9 * 100.0


def _last_windows(recent: collections.deque[tuple[Any, ...]], interval_ms: int | None,
                  opening: bool = False) -> list[tuple[Any, ...]]:
    """The windows that ended in the last ``interval_ms`` (all if None), oldest first;
    ``opening`` adds the one before, which opens the interval for a rate.

    Walks back from the newest window only as far as needed: views ask for every
    operator's figures at once, under the master's lock.
    """
    if interval_ms is None or not recent:
        return list(recent)
    since = recent[-1][_END] - interval_ms
    found: list[tuple[Any, ...]] = []
    for window in reversed(recent):
        if window[_END] <= since:
            if opening:
                found.append(window)
            break
        found.append(window)
    return found[::-1]


def event_time_lag_ms(watermark_ms: int, now_ms: int) -> int:
    """How far event time trails the wall clock: ``now_ms`` minus the watermark; 0 without
    a watermark, after the end (``END_OF_TIME``) or when event time is ahead of the clock.

    >>> event_time_lag_ms(1_000, 61_000), event_time_lag_ms(END_OF_TIME, 61_000)
    (60000, 0)
    """
    if watermark_ms in (NO_WATERMARK, END_OF_TIME):
        return 0
    return max(0, now_ms - watermark_ms)


def window_latency_ms(window: WindowRecord, upstream: Sequence[OperatorStatsTracker]
                      ) -> int | None:
    """END_WINDOW of ``window`` here minus the latest upstream END_WINDOW of the same
    window; None for an input operator or while upstream's is unknown."""
    if not window.end_window_ms:
        return None
    known = [t for u in upstream if (t := u.end_window_ms(window.window_id)) is not None]
    return max(0, window.end_window_ms - max(known)) if known else None


def latency_ms(tracker: OperatorStatsTracker, upstream: Iterable[OperatorStatsTracker],
               interval_ms: int | None = None) -> float:
    """Mean of END_WINDOW here minus the latest upstream END_WINDOW, over recent windows
    (those that ended in the last ``interval_ms``, if given).

    Zero for an input operator, or while no window is known on both sides.
    """
    upstream = list(upstream)
    if not upstream or not tracker.window_ring:
        return 0.0
    gaps = [gap for window in _last_windows(tracker.window_ring, interval_ms)
            if (gap := window_latency_ms(WindowRecord._make(window), upstream)) is not None]
    return sum(gaps) / len(gaps) if gaps else 0.0


@dataclasses.dataclass
class ContainerStatsTracker:
    """The figures of a container's last heartbeat, and how many heartbeats it sent."""

    process_name: str = ""
    pid: int = 0
    host: str = ""
    cpu_percent: float = 0.0
    memory_rss_mb: int = 0
    memory_mb_free: int = 0
    gc_collection_count: int = 0
    gc_collection_time_ms: int = 0
    heartbeats: int = 0
    last_heartbeat_ms: int = 0
    last_sent_tms: int = 0
    #: its buffer server's room as of the last heartbeat (``BufferServerStats``'s fields)
    buffer_memory_limit_bytes: int = 0
    buffer_memory_bytes: int = 0
    buffer_disk_bytes: int = 0
    buffer_blocks_spilled: int = 0

    def record(self, heartbeat: umbilical_pb2.ContainerHeartbeat, now_ms: int) -> None:
        self.process_name = heartbeat.jvm_name or self.process_name
        if heartbeat.pid:
            self.pid, self.host = heartbeat.pid, heartbeat.host
        self.cpu_percent = heartbeat.cpu_percent
        self.memory_rss_mb = heartbeat.memory_rss_mb
        self.memory_mb_free = heartbeat.memory_mb_free
        self.gc_collection_count = heartbeat.gc_collection_count
        self.gc_collection_time_ms = heartbeat.gc_collection_time_ms
        room = heartbeat.buffer_server
        self.buffer_memory_limit_bytes = max(room.memory_limit_bytes, 0)
        self.buffer_memory_bytes = max(room.memory_bytes, 0)
        self.buffer_disk_bytes = max(room.disk_bytes, 0)
        self.buffer_blocks_spilled = max(room.blocks_spilled, 0)
        self.heartbeats += 1
        self.last_heartbeat_ms = now_ms
        self.last_sent_tms = heartbeat.sent_tms
