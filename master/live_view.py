"""Views that refresh while an application runs: ``weir top`` and ``weir run``'s progress line.

Both read the same messages as every other command (``master.views``); they only decide
how often and where to show them.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from google.protobuf import json_format

from weir.master import tables
from weir.operators.windows import format_window_id
from weir.proto import client_pb2

__all__ = ["ProgressLine", "Snapshot", "progress_text", "run_top", "top_screen"]

_LOGGER = logging.getLogger(__name__)

_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen


class Snapshot:
    """One refresh: the application, its operators and containers, read together."""

    def __init__(self, app: client_pb2.ApplicationInfo,
                 operators: list[client_pb2.OperatorInfo],
                 containers: list[client_pb2.ContainerInfo]) -> None:
        self.app, self.operators, self.containers = app, operators, containers

    def to_dict(self) -> dict[str, Any]:
        def as_dict(message: Any) -> dict[str, Any]:
            return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                             always_print_fields_with_no_presence=True)

        return {"time_ms": time.time_ns() // 1_000_000, "application": as_dict(self.app),
                "operators": [as_dict(op) for op in self.operators],
                "containers": [as_dict(c) for c in self.containers]}


def top_screen(snapshot: Snapshot, now_ms: int) -> str:
    """The text ``weir top`` shows: a summary line, operators, containers."""
    app = snapshot.app
    head = (f"{app.id} {app.name} {app.state}  window {format_window_id(app.current_window_id)}"
            f"  committed {format_window_id(app.committed_window_id)}  "
            f"{tables.format_rate(app.tuples_processed_per_second)} tuples/s in  "
            f"latency {app.latency_ms:.0f} ms  failures {app.operator_failures}  "
            f"{tables.format_time(now_ms)}")
    return "\n\n".join([
        head + (f"\n{app.diagnostics}" if app.diagnostics else ""),
        tables.render_table(tables.OPERATOR_HEADERS, tables.operator_rows(snapshot.operators),
                            tables.OPERATOR_RIGHT),
        tables.render_table(tables.CONTAINER_HEADERS,
                            tables.container_rows(snapshot.containers, now_ms),
                            tables.CONTAINER_RIGHT),
    ])


def run_top(read: Callable[[], Snapshot], *, interval_s: float = 1.0,
            count: int | None = None, as_json: bool = False, out: TextIO | None = None,
            sleep: Callable[[float], None] = time.sleep) -> int:
    """Shows ``read()`` every ``interval_s`` until Ctrl-C (or ``count`` refreshes).

    On a terminal the screen is cleared before each refresh; with ``as_json`` each
    refresh is one JSON document on one line (for ``jq`` and scripts).
    """
    out = out or sys.stdout
    clear = not as_json and out.isatty()
    shown = 0
    try:
        while count is None or shown < count:
            if shown:
                sleep(interval_s)
            snapshot = read()
            if as_json:
                out.write(json.dumps(snapshot.to_dict(), separators=(",", ":")) + "\n")
            else:
                text = top_screen(snapshot, time.time_ns() // 1_000_000)
                out.write((_CLEAR if clear else ("\n" if shown else "")) + text + "\n")
            out.flush()
            shown += 1
    except KeyboardInterrupt:
        pass
    return 0


def progress_text(app: client_pb2.ApplicationInfo) -> str:
    """``weir run``'s progress: windows, throughput and the committed window; before the
    first window, what it waits for (containers to start, then operators to set up: Spark
    starts in each container that runs it, the longest wait of a first run)."""
    if app.state == "RUNNING" and app.current_window_id < 0:
        waiting = (f"starting containers ({app.containers_active}/{app.containers_planned} up)"
                   if app.containers_active < app.containers_planned else
                   "operators setting up (a container that runs Spark starts it first)")
        return f"{app.id} {app.state}: no window yet, {waiting}"
    return (f"{app.id} {app.state}: window {format_window_id(app.current_window_id)}, "
            f"{tables.format_rate(app.tuples_processed_per_second)} tuples/s, "
            f"{tables.format_count(app.total_tuples_processed)} processed, committed "
            f"{format_window_id(app.committed_window_id)}, containers "
            f"{app.containers_active}/{app.containers_planned}")


class ProgressLine:
    """A live line on a terminal (rewritten in place), else a line every ``every_s``.

    Args:
        stream: where to write (stderr for ``weir run``).
        every_s: how often a non-terminal gets a line (a state change always gets one).
        quiet: show nothing.
    """

    def __init__(self, stream: TextIO, every_s: float = 5.0, quiet: bool = False) -> None:
        self.stream = stream
        self.every_s = every_s
        self.quiet = quiet
        self.tty = stream.isatty()
        self._shown = ""
        self._state = ""
        self._last_s = float("-inf")

    def show(self, app: client_pb2.ApplicationInfo) -> None:
        if self.quiet:
            return
        line = progress_text(app)
        if self.tty:
            self.stream.write("\r" + line.ljust(len(self._shown)))
            self._shown = line
        else:
            now = time.monotonic()
            if app.state == self._state and now - self._last_s < self.every_s:
                return
            self.stream.write(line + "\n")
            self._state, self._last_s = app.state, now
        self.stream.flush()

    def clear(self) -> None:
        """Removes the live line (before the final report)."""
        if self.tty and self._shown:
            self.stream.write("\r" + " " * len(self._shown) + "\r")
            self.stream.flush()
            self._shown = ""
