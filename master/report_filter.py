"""An operator's window stats, read from its report once, with only what may be kept:
stats of the ports the plan gave it, and a bounded set of user metrics.

Read once: walking a parsed protobuf message's repeated fields costs more than the rules
the master applies to what they hold (each walk builds the sub-messages' Python objects
anew), and four rules look at each window (window ids, statistics, checkpoints, bounds).
So the report is read into plain values here, and the rules look at those.

Bounded: the master keeps totals per port and the newest user metrics per operator (and
per window, in the ``weir stats`` ring) for as long as the application is known, so a
report naming ports or metrics at will would grow the master without bound (the audit of
issue 17 grew it past 1 GB). What is left out is named in a rate-limited warning; the
rest of the report counts.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import NamedTuple

from weir.proto import umbilical_pb2

__all__ = ["MAX_ERROR_CHARS", "MAX_METRIC_NAME_CHARS", "MAX_METRICS", "PortFigures",
           "ReportedCheckpoint", "ReportedWindow", "TRANSPORTS", "bounded_text", "read_windows"]

PortFigures = tuple[str, int, int, int, int, str]
"""One port in one window: (name, tuples, buffer-server bytes, END_WINDOW ms, queue size,
transport); a plain tuple, as a report has a few per window."""

TRANSPORTS = frozenset({"local", "flight"})
"""How an input reads its upstream (``PortStats.transport``); another value reads as ""."""


class ReportedCheckpoint(NamedTuple):
    window_id: int
    time_ms: int
    start_ms: int
    size_bytes: int


class ReportedWindow(NamedTuple):
    """One window of an operator's report, as the master's rules read it."""

    window_id: int
    inputs: list[PortFigures]
    outputs: list[PortFigures]
    cpu_time_ns: int
    watermark_ms: int
    metrics: dict[str, float] | None
    checkpoint: ReportedCheckpoint | None
    begin_window_ms: int


MAX_METRICS = 64
"""User metrics kept per operator and window; more are left out."""

MAX_METRIC_NAME_CHARS = 128
"""A longer metric name is left out."""

MAX_ERROR_CHARS = 4_000
"""What the master keeps (and journals, and logs) of one error or log text a container
sends: a stack trace's head and its last line; the container's own log has it whole."""


def bounded_text(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` if short enough, else its head and tail around a note of what was cut.

    >>> bounded_text("a" * 10 + "Z", limit=8)
    'aaaa… [3 characters cut] …aaaZ'
    """
    if len(text) <= limit:
        return text
    keep = max(limit // 2, 1)
    cut = len(text) - 2 * keep
    return f"{text[:keep]}… [{cut} characters cut] …{text[-keep:]}"


def read_windows(report: umbilical_pb2.OperatorHeartbeat,
                 ports: tuple[frozenset[str], frozenset[str]]
                 ) -> tuple[list[ReportedWindow], str]:
    """``report``'s windows, without ports other than the operator's (input and output
    names, ``PTOperator.port_names``) and user metrics past the bounds; and what was left
    out ("" = nothing).

    Plain loops, tuples built in C: this runs for every operator of every heartbeat.
    """
    declared_inputs, declared_outputs = ports
    windows: list[ReportedWindow] = []
    unknown: list[str] = []
    too_long = extra = 0
    for window in report.window_stats:
        inputs = _read_ports(window.input_ports, declared_inputs, "input", unknown)
        outputs = _read_ports(window.output_ports, declared_outputs, "output", unknown)
        metrics: dict[str, float] | None = None
        if window.metrics:
            metrics = dict(window.metrics)
            if len(metrics) > MAX_METRICS or any(len(name) > MAX_METRIC_NAME_CHARS
                                                 for name in metrics):
                metrics, long_names, past = _bounded(metrics)
                too_long, extra = max(too_long, long_names), max(extra, past)
        checkpoint = None
        if window.HasField("checkpoint"):
            figures = window.checkpoint_stats
            checkpoint = _new_checkpoint((window.checkpoint.window_id,
                                          figures.checkpoint_time_ms,
                                          figures.checkpoint_start_time,
                                          figures.checkpoint_bytes))
        windows.append(_new_window((window.window_id, inputs, outputs, window.cpu_time_used_ns,
                                    window.watermark_ms, metrics, checkpoint,
                                    window.begin_window_ms)))
    if not (unknown or too_long or extra):
        return windows, ""
    return windows, _left_out(list(dict.fromkeys(unknown)), extra, too_long)


def _read_ports(ports: Iterable[umbilical_pb2.PortStats], declared: frozenset[str], kind: str,
                unknown: list[str]) -> list[PortFigures]:
    """The figures of the ``declared`` ports among ``ports``; the others named in
    ``unknown``."""
    read: list[PortFigures] = []
    for port in ports:
        if port.id in declared:
            read.append((port.id, port.tuple_count, port.buffer_server_bytes,
                         port.end_window_timestamp, port.queue_size,
                         port.transport if port.transport in TRANSPORTS else ""))
        else:
            unknown.append(f"{kind} {port.id[:40]!r}")
    return read


# NamedTuple's own constructor is a Python function; these build the same tuples in C
_new_window = functools.partial(tuple.__new__, ReportedWindow)
_new_checkpoint = functools.partial(tuple.__new__, ReportedCheckpoint)


def _bounded(metrics: dict[str, float]) -> tuple[dict[str, float] | None, int, int]:
    """The first ``MAX_METRICS`` metrics with a name of at most ``MAX_METRIC_NAME_CHARS``;
    how many names were too long, and how many were past the first ``MAX_METRICS``."""
    short = [name for name in metrics if len(name) <= MAX_METRIC_NAME_CHARS]
    kept = {name: metrics[name] for name in short[:MAX_METRICS]}
    return kept or None, len(metrics) - len(short), max(0, len(short) - MAX_METRICS)


def _left_out(ports: list[str], extra: int, too_long: int) -> str:
    parts = []
    if ports:
        parts.append(f"{len(ports)} port(s) it does not have ({', '.join(ports[:3])}"
                     f"{', ...' if len(ports) > 3 else ''})")
    if extra:
        parts.append(f"{extra} metric(s) past the first {MAX_METRICS}")
    if too_long:
        parts.append(f"{too_long} metric name(s) over {MAX_METRIC_NAME_CHARS} characters")
    return "; ".join(parts)
