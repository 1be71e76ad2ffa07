"""Plain-text tables and readable figures for the ``weir`` commands (people, not scripts).

>>> print(render_table(["ID", "TUPLES"], [["1", "12,345"], ["20", "7"]], right={"TUPLES"}))
ID  TUPLES
1   12,345
20       7
>>> format_mb(1536), format_count(1234567), format_duration_ms(75_000)
('1.5 GB', '1,234,567', '1 min 15 s')
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable, Mapping, Sequence

from weir.operators.watermarks import END_OF_TIME, NO_WATERMARK, format_watermark
from weir.operators.windows import format_window_id
from weir.proto import client_pb2

__all__ = [
    "application_details",
    "application_rows",
    "container_rows",
    "format_ago",
    "format_bytes",
    "format_count",
    "format_duration_ms",
    "format_mb",
    "format_rate",
    "format_time",
    "operator_details",
    "operator_rows",
    "render_table",
]

_LOGGER = logging.getLogger(__name__)

_MAX_CELL = 60


def render_table(headers: Sequence[str], rows: Iterable[Sequence[str]],
                 right: Iterable[str] = ()) -> str:
    """Aligned columns separated by two spaces; columns named in ``right`` align right."""
    rows = [[_clip(str(cell)) for cell in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    right = set(right)
    lines = []
    for row in [list(headers), *rows]:
        cells = [cell.rjust(w) if h in right else cell.ljust(w)
                 for cell, w, h in zip(row, widths, headers, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_CELL else text[:_MAX_CELL - 1] + "…"


def format_count(n: int) -> str:
    return f"{n:,}"


def format_rate(per_second: float) -> str:
    return f"{per_second:,.1f}"


def format_bytes(size: float) -> str:
    """Bytes, readable: ``1.5 MB``."""
    for unit, unit_size in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if size >= unit_size:
            return f"{size / unit_size:.1f} {unit}"
    return f"{size:.0f} B"


def format_bytes_rate(per_second: float) -> str:
    """Bytes per second, readable: ``1.5 MB/s``."""
    return f"{format_bytes(per_second)}/s"


def format_metrics(metrics: Mapping[str, float]) -> str:
    """User metrics as ``name=value`` pairs, sorted; ``-`` if none."""
    return " ".join(f"{k}={v:g}" for k, v in sorted(metrics.items())) or "-"


def format_mb(mb: float) -> str:
    if mb <= 0:
        return "-"
    if mb >= 1024:
        return f"{mb / 1024:.1f} GB"
    return f"{mb:.0f} MB"


def format_duration_ms(ms: float) -> str:
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def format_ago(then_ms: int, now_ms: int) -> str:
    if then_ms <= 0:
        return "-"
    return f"{format_duration_ms(max(0, now_ms - then_ms))} ago"


def format_time(ms: int) -> str:
    if ms <= 0:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


APPLICATION_HEADERS = ["ID", "NAME", "STATE", "CONTAINERS", "OPERATORS", "WINDOW",
                       "COMMITTED", "FAILURES", "RECOVERIES", "PROCESSED", "EMITTED",
                       "SUBMITTED", "DURATION", "DIAGNOSTICS"]
APPLICATION_RIGHT = {"CONTAINERS", "OPERATORS", "FAILURES", "RECOVERIES", "PROCESSED",
                     "EMITTED", "DURATION"}


def shown_state(app: client_pb2.ApplicationInfo, now_ms: int) -> str:
    """Its state, with how long it has been stalled (``master.progress``) if it is."""
    if app.stalled_since_ms and app.state == "RUNNING":
        return f"RUNNING, STALLED {format_duration_ms(now_ms - app.stalled_since_ms)}"
    return app.state


def application_rows(apps: Iterable[client_pb2.ApplicationInfo], now_ms: int
                     ) -> list[list[str]]:
    rows = []
    for app in apps:
        end_ms = app.finished_ms or now_ms
        rows.append([
            app.id, app.name, shown_state(app, now_ms),
            f"{app.containers_active}/{app.containers_planned}",
            _operator_count(app), format_window_id(app.current_window_id),
            format_window_id(app.committed_window_id), str(app.operator_failures),
            str(app.recoveries),
            format_count(app.total_tuples_processed), format_count(app.total_tuples_emitted),
            format_time(app.submitted_ms), format_duration_ms(end_ms - app.submitted_ms),
            app.diagnostics or _savepoint_note(app)
            or (f"recovered: {app.last_recovery}" if app.last_recovery else "-"),
        ])
    return rows


def _operator_count(app: client_pb2.ApplicationInfo) -> str:
    """``12``, or ``12 (1 failed, 3 not running)`` while some are not running windows."""
    notes = [f"{n} {what}" for n, what in ((app.operators_failed, "failed"),
                                           (app.operators_not_running, "not running")) if n]
    return f"{app.operators} ({', '.join(notes)})" if notes else str(app.operators)


def _savepoint_note(app: client_pb2.ApplicationInfo) -> str:
    """Where the run came from or the savepoint it took, for ``weir apps``."""
    if app.savepoint_path:
        return f"savepoint {app.savepoint_state} at {app.savepoint_path}"
    return f"from savepoint {app.from_savepoint}" if app.from_savepoint else ""


CONTAINER_HEADERS = ["ID", "APP", "STATE", "PROCESS", "BUFFER SERVER", "OPERATORS", "CPU %",
                     "RSS", "FREE", "BUFFERED", "GC", "HEARTBEATS", "LAST HEARTBEAT",
                     "DIAGNOSTICS"]
CONTAINER_RIGHT = {"CPU %", "RSS", "FREE", "GC", "HEARTBEATS"}


def container_rows(containers: Iterable[client_pb2.ContainerInfo], now_ms: int
                   ) -> list[list[str]]:
    rows = []
    for c in containers:
        measured = c.heartbeats and c.state != "KILLED"  # a dead process has no current figures
        gc = (f"{c.gc_collection_count} / {c.gc_collection_time_ms} ms"
              if c.heartbeats else "-")
        rows.append([
            c.id, c.application_id, c.state, c.process_name or "-",
            c.buffer_server_address or "-", ",".join(str(i) for i in c.operator_ids) or "-",
            f"{c.cpu_percent:.1f}" if measured else "-",
            format_mb(c.memory_rss_mb) if measured else "-",
            format_mb(c.memory_mb_free) if measured else "-",
            _buffered(c) if measured else "-", gc, str(c.heartbeats),
            format_ago(c.last_heartbeat_ms, now_ms), _container_diagnostics(c),
        ])
    return rows


def _buffered(c: client_pb2.ContainerInfo) -> str:
    """The buffer server's streams in memory, of its limit (BUFFER_MEMORY_MB), and on disk."""
    if not c.buffer_memory_limit_bytes:
        return "-"  # an older container that does not report it
    text = (f"{c.buffer_memory_bytes / 2**20:.0f} MB of "
            f"{format_mb(c.buffer_memory_limit_bytes / 2**20)}")
    return text + (f", {c.buffer_disk_bytes / 2**20:.0f} MB on disk"
                   if c.buffer_disk_bytes else "")


def _container_diagnostics(c: client_pb2.ContainerInfo) -> str:
    notes = [c.diagnostics] if c.diagnostics else []
    if c.replaced_by:
        notes.append(f"replaced by {c.replaced_by}")
    if c.replaces:
        notes.append(f"replaces {c.replaces}")
    return "; ".join(notes) or "-"


OPERATOR_HEADERS = ["ID", "NAME", "CONTAINER", "STATE", "WINDOW", "CHECKPOINT", "RECOVERY",
                    "CKPT MS", "FAILURES", "WINDOWS", "PROCESSED", "EMITTED", "IN/S", "OUT/S",
                    "CPU %", "LATENCY", "ERROR"]
OPERATOR_RIGHT = {"ID", "CKPT MS", "FAILURES", "WINDOWS", "PROCESSED", "EMITTED", "IN/S",
                  "OUT/S", "CPU %", "LATENCY"}


def _latest_checkpoint(op: client_pb2.OperatorInfo) -> str:
    """The newest checkpoint the current instance can restart from, and why there is none."""
    if op.checkpoint_window_id >= 0:
        return format_window_id(op.checkpoint_window_id)
    if op.checkpoints:
        start = format_window_id(op.deploy_window_id) if op.deploy_window_id >= 0 else "scratch"
        return (f"- (its earlier checkpoints were dropped: it restarted from {start} and has "
                "not checkpointed since)")
    return "-"


def _checkpoint_ms(op: client_pb2.OperatorInfo) -> str:
    """Last / average checkpoint time."""
    if not op.checkpoints:
        return "-"
    return f"{op.checkpoint_time_ms}/{op.checkpoint_time_avg_ms:.0f}"


def operator_rows(operators: Iterable[client_pb2.OperatorInfo]) -> list[list[str]]:
    return [[
        str(op.id), op.name, op.container_id, op.state, format_window_id(op.current_window_id),
        format_window_id(op.checkpoint_window_id), format_window_id(op.recovery_window_id),
        _checkpoint_ms(op), str(op.failure_count),
        format_count(op.windows_processed), format_count(op.total_tuples_processed),
        format_count(op.total_tuples_emitted), format_rate(op.tuples_processed_per_second),
        format_rate(op.tuples_emitted_per_second), f"{op.cpu_percent:.1f}",
        f"{op.latency_ms:.0f} ms", op.error or "-",
    ] for op in operators]


def operator_details(op: client_pb2.OperatorInfo, now_ms: int, windows: int = 10) -> str:
    """``weir stats``: the operator's figures, its ports and its last ``windows`` windows."""
    fields = [
        ("operator", f"{op.name} (id {op.id})"),
        ("class", op.class_name),
        ("application", op.application_id),
        ("container", op.container_id),
        ("state", op.state),
        ("current window", format_window_id(op.current_window_id)),
        ("windows processed", format_count(op.windows_processed)),
        ("tuples processed", f"{format_count(op.total_tuples_processed)} "
                             f"({format_rate(op.tuples_processed_per_second)}/s)"),
        ("tuples emitted", f"{format_count(op.total_tuples_emitted)} "
                           f"({format_rate(op.tuples_emitted_per_second)}/s)"),
        ("cpu", f"{op.cpu_percent:.1f} %"),
        ("latency", f"{op.latency_ms:.0f} ms"),
        ("watermark", format_watermark(op.watermark_ms)),
        ("event-time lag", _event_time_lag(op)),
        ("metrics", format_metrics(op.metrics)),
        ("processing mode", op.processing_mode or "-"),
        ("latest checkpoint", _latest_checkpoint(op)),
        ("checkpoints", f"{format_count(op.checkpoints)} saved over its life (last "
                        f"{op.checkpoint_time_ms} ms, average {op.checkpoint_time_avg_ms:.1f} ms)"
         if op.checkpoints else "0"),
        ("state", f"{format_bytes(op.checkpoint_bytes)} (its last checkpoint)"
         if op.checkpoint_bytes else "-"),
        ("recovery window", format_window_id(op.recovery_window_id)),
        ("committed window", format_window_id(op.committed_window_id)),
        ("started from", format_window_id(op.deploy_window_id)
         if op.deploy_window_id >= 0 else "scratch"),
        ("failures", f"{op.failure_count} ({op.failures_in_a_row} in a row, "
                     f"restart limit {op.max_restarts})"),
        ("last heartbeat", format_ago(op.last_heartbeat_ms, now_ms)),
    ]
    if op.error:
        fields.append(("error", op.error))
    width = max(len(name) for name, _ in fields)
    parts = ["\n".join(f"{name + ':':<{width + 1}} {value}" for name, value in fields)]
    if op.ports:
        parts.append(render_table(
            ["PORT", "TYPE", "TUPLES", "TUPLES/S", "BUFFER SERVER BYTES", "BYTES/S", "QUEUE",
             "READS"],
            [[p.name, p.type, format_count(p.total_tuples), format_rate(p.tuples_per_second),
              format_count(p.buffer_server_bytes),
              format_bytes_rate(p.buffer_server_bytes_per_second), str(p.queue_size),
              p.transport or "-"]
             for p in op.ports],
            right={"TUPLES", "TUPLES/S", "BUFFER SERVER BYTES", "BYTES/S", "QUEUE"}))
    recent = list(op.recent_windows)[-windows:] if windows > 0 else []
    if recent:
        parts.append(f"last {len(recent)} windows:\n" + render_table(
            ["WINDOW", "PROCESSED", "EMITTED", "END WINDOW", "LATENCY", "CPU", "METRICS"],
            [[format_window_id(w.window_id), format_count(w.tuples_processed),
              format_count(w.tuples_emitted), _clock_ms(w.end_window_ms),
              f"{w.latency_ms:.0f} ms" if w.latency_ms >= 0 else "-",
              f"{w.cpu_time_ns / 1e6:.1f} ms", format_metrics(w.metrics)] for w in recent],
            right={"PROCESSED", "EMITTED", "LATENCY", "CPU"}))
    return "\n\n".join(parts)


def _event_time_lag(op: client_pb2.OperatorInfo) -> str:
    """How far its watermark trails the wall clock; '-' without one or after the end."""
    if op.watermark_ms in (NO_WATERMARK, END_OF_TIME):
        return "-"
    return format_duration_ms(op.event_time_lag_ms)


def _clock_ms(ms: int) -> str:
    if ms <= 0:
        return "-"
    moment = datetime.datetime.fromtimestamp(ms / 1000)
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def application_details(app: client_pb2.ApplicationInfo, now_ms: int) -> str:
    """``weir app``: the application's figures, its logical operators and recent failures."""
    end_ms = app.finished_ms or now_ms
    fields = [
        ("application", f"{app.id} ({app.name})"),
        ("state", shown_state(app, now_ms)
         + (f": {app.diagnostics}" if app.diagnostics else "")),
        ("submitted", f"{format_time(app.submitted_ms)} "
                      f"({format_duration_ms(end_ms - app.submitted_ms)})"),
        ("containers", f"{app.containers_active} active of {app.containers_planned}"
                       f" ({app.containers_replaced} replaced"
                       + (f", {app.containers_spare} spare)" if app.containers_spare else ")")),
        ("operators", f"{app.operators} ({app.operators_failed} failed, "
                      f"{app.operators_not_running} not running: deploying, in setup, "
                      "activating or recovering)"),
        ("current window", format_window_id(app.current_window_id)),
        ("committed window", format_window_id(app.committed_window_id)),
        ("tuples processed", f"{format_count(app.total_tuples_processed)} "
                             f"({format_rate(app.tuples_processed_per_second)}/s)"),
        ("tuples emitted", f"{format_count(app.total_tuples_emitted)} "
                           f"({format_rate(app.tuples_emitted_per_second)}/s)"),
        ("latency", f"{app.latency_ms:.0f} ms along {' -> '.join(app.critical_path) or '-'}"),
        ("failures", f"{app.operator_failures} of operators, {app.recoveries} recoveries"),
    ]
    if app.restart_at_ms > now_ms and not app.finished_ms:
        fields.append(("restart", f"in {format_duration_ms(app.restart_at_ms - now_ms)} "
                                  f"(backoff {format_duration_ms(app.restart_delay_ms)}, "
                                  "RESTART_BACKOFF_MILLIS)"))
    if app.repartitions:
        fields.append(("repartitions", f"{app.repartitions}, last: {app.last_repartition}"))
    if app.from_savepoint:
        fields.append(("from savepoint", app.from_savepoint))
    if app.savepoint_path:
        fields.append(("savepoint", f"{app.savepoint_state} at {app.savepoint_path}"))
    if app.dashboard_url:
        fields.append(("dashboard", app.dashboard_url))
    width = max(len(name) for name, _ in fields)
    parts = ["\n".join(f"{name + ':':<{width + 1}} {value}" for name, value in fields)]
    if app.logical_operators:
        parts.append(render_table(
            ["OPERATOR", "PARTITIONS", "PROCESSED", "EMITTED", "IN/S", "OUT/S", "LATENCY",
             "METRICS"],
            [[op.name, str(len(op.partition_ids)), format_count(op.total_tuples_processed),
              format_count(op.total_tuples_emitted), format_rate(op.tuples_processed_per_second),
              format_rate(op.tuples_emitted_per_second), f"{op.latency_ms:.0f} ms",
              format_metrics(op.metrics)] for op in app.logical_operators],
            right={"PARTITIONS", "PROCESSED", "EMITTED", "IN/S", "OUT/S", "LATENCY"}))
    if app.recent_failures:
        parts.append("recent failures:\n" + render_table(
            ["WHEN", "KIND", "WHAT", "MESSAGE"],
            [[format_time(f.time_ms), f.kind, f.subject, f.message]
             for f in app.recent_failures]))
    return "\n\n".join(parts)
