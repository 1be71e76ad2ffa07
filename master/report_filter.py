"""What one operator's report may add to the master's memory: stats of the ports the plan
gave it, and a bounded set of user metrics.

The master keeps totals per port and the newest user metrics per operator (and per
window, in the ``weir stats`` ring) for as long as the application is known, so a report
naming ports or metrics at will would grow the master without bound (the audit of issue
17 grew it past 1 GB). What is left out is named in a rate-limited warning; the rest of
the report counts.
"""

from __future__ import annotations

from master.physical_plan import PTOperator
from proto import umbilical_pb2

__all__ = ["MAX_ERROR_CHARS", "MAX_METRIC_NAME_CHARS", "MAX_METRICS", "bounded_text",
           "filter_report"]

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


def filter_report(op: PTOperator, report: umbilical_pb2.OperatorHeartbeat) -> str:
    """Removes, in place, window stats of ports ``op`` does not have and user metrics past
    the bounds; returns what was removed ("" = nothing)."""
    inputs, outputs = op.port_names
    for window in report.window_stats:  # the usual report is looked at once, and kept
        for port in window.input_ports:
            if port.id not in inputs:
                return _filter(report, inputs, outputs)
        for port in window.output_ports:
            if port.id not in outputs:
                return _filter(report, inputs, outputs)
        metrics = window.metrics
        if metrics and (len(metrics) > MAX_METRICS
                        or any(len(name) > MAX_METRIC_NAME_CHARS for name in metrics)):
            return _filter(report, inputs, outputs)
    return ""


def _filter(report: umbilical_pb2.OperatorHeartbeat, inputs: frozenset[str],
            outputs: frozenset[str]) -> str:
    ports_left_out: dict[str, None] = {}
    too_long = extra = 0
    for window in report.window_stats:
        for ports, declared, kind in ((window.input_ports, inputs, "input"),
                                      (window.output_ports, outputs, "output")):
            unknown = [i for i, port in enumerate(ports) if port.id not in declared]
            ports_left_out.update((f"{kind} {ports[i].id[:40]!r}", None) for i in unknown)
            for index in reversed(unknown):
                del ports[index]
        metrics = window.metrics
        if metrics and (len(metrics) > MAX_METRICS
                        or any(len(name) > MAX_METRIC_NAME_CHARS for name in metrics)):
            names = list(metrics)
            long_names = [n for n in names if len(n) > MAX_METRIC_NAME_CHARS]
            past = [n for n in names if len(n) <= MAX_METRIC_NAME_CHARS][MAX_METRICS:]
            for name in long_names + past:
                del window.metrics[name]
            too_long, extra = max(too_long, len(long_names)), max(extra, len(past))
    parts = []
    if ports_left_out:
        named = list(ports_left_out)
        parts.append(f"{len(named)} port(s) it does not have ({', '.join(named[:3])}"
                     f"{', ...' if len(named) > 3 else ''})")
    if extra:
        parts.append(f"{extra} metric(s) past the first {MAX_METRICS}")
    if too_long:
        parts.append(f"{too_long} metric name(s) over {MAX_METRIC_NAME_CHARS} characters")
    return "; ".join(parts)
