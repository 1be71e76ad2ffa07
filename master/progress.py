"""The application's progress watchdog: a committed window that stops moving while the
sources still emit is a condition the master names, with its cause, not silence.

Each operator has its own watch (``liveness.blocked_operators``: a window that stands
still while its input has data), but an application can stop without any operator
blocked: an operator waiting to be deployed behind a stuck one, a recovery that never
completes, a checkpoint that is never taken. Every view then said RUNNING. Here, once the
committed window has not moved for ``stall_after_ms`` while the sources emitted tuples,
the application is *stalled*: said once among its recent failures (the operator furthest
behind, its state and container), shown by ``weir apps``, ``weir app``, the dashboard and
Prometheus until a window commits again (said too).
"""

from __future__ import annotations

import logging

from weir.master.application import Application, ApplicationState
from weir.master.liveness import timeout_window_count
from weir.master.physical_plan import PTOperator
from weir.operators.windows import format_window_id
from weir.proto import plan_pb2

__all__ = ["STALL_FLOOR_MS", "check_progress", "stall_after_ms"]

_LOGGER = logging.getLogger(__name__)

STALL_FLOOR_MS = 120_000
"""The least time without a committed window before an application is stalled: twice
the blocked-operator floor, so that an operator the master is already recovering (its
own watch fired) is not said twice."""


def stall_after_ms(app: Application) -> int:
    """How long the committed window may stand still while the sources emit before the
    application is stalled (``_stall_after_ms``, derived once per plan)."""
    return _plan_facts(app)[0]


def _stall_after_ms(app: Application) -> int:
    """How long the committed window may stand still while the sources emit:
    ``STALL_TIMEOUT_MILLIS`` if set, else an operator's window timeout (the longest) plus
    a checkpoint interval, at least ``STALL_FLOOR_MS``."""
    given = int(app.plan.attributes.get("STALL_TIMEOUT_MILLIS", 0))
    if given:
        return given
    window_ms = int(app.attribute("STREAMING_WINDOW_SIZE_MILLIS"))
    checkpoint_ms = window_ms * int(app.plan.attributes.get("CHECKPOINT_WINDOW_COUNT", 1))
    longest = max((timeout_window_count(op, window_ms) * window_ms
                   for op in app.plan.operators.values()), default=0)
    return max(STALL_FLOOR_MS, longest + checkpoint_ms)


def check_progress(app: Application, now_ms: int) -> str | None:
    """One look at ``app``'s progress; the cause when it has just stalled (recorded among
    its reported errors, the log told), else None."""
    if app.state != ApplicationState.RUNNING or app.shutdown_requested:
        app.progress_committed, app.stalled_since_ms = -2, 0
        return None
    emitted = _emitted_by_sources(app)
    if app.committed_window_id != app.progress_committed:
        if app.stalled_since_ms:
            said = (f"progressing again: window {format_window_id(app.committed_window_id)} "
                    f"committed after {(now_ms - app.stalled_since_ms) / 1000:.0f} s")
            app.report_error("master", said, now_ms)
            _LOGGER.warning("app=%s %s", app.id, said)
        app.progress_committed, app.progress_since_ms = app.committed_window_id, now_ms
        app.progress_emitted, app.stalled_since_ms = emitted, 0
        return None
    waited_ms = now_ms - app.progress_since_ms
    if app.stalled_since_ms or emitted <= app.progress_emitted \
            or waited_ms < stall_after_ms(app):
        return None
    app.stalled_since_ms = app.progress_since_ms
    cause = (f"stalled: no window committed for {waited_ms / 1000:.0f} s (committed "
             f"{format_window_id(app.committed_window_id)}) while the sources emitted "
             f"{emitted - app.progress_emitted:,} tuples; furthest behind: "
             f"{_furthest_behind(app, now_ms)}")
    app.report_error("master", cause, now_ms)
    _LOGGER.warning("app=%s %s", app.id, cause)
    return cause


def _emitted_by_sources(app: Application) -> int:
    stats = app.operator_stats
    return sum(stats[op_id].total_tuples_emitted for op_id in _plan_facts(app)[1])


def _plan_facts(app: Application) -> tuple[int, list[int]]:
    """The stall bound and the input operators' ids, derived once per plan (a repartition
    makes a new one): the master loop looks at every application five times a second."""
    cached = app.__dict__.get("_progress_facts")
    if cached is None or cached[0] != app.repartitions:
        inputs = [op.id for op in app.plan.operators.values()
                  if op.type == plan_pb2.OPERATOR_TYPE_INPUT]
        cached = (app.repartitions, (_stall_after_ms(app), inputs))
        app.__dict__["_progress_facts"] = cached
    return cached[1]


def _furthest_behind(app: Application, now_ms: int) -> str:
    """The operator holding the committed window back: the one with the oldest latest
    checkpoint of its own (then the lowest window, the most upstream), with its state,
    container and how long its own window has stood still."""
    ops = list(app.plan.operators.values())
    if not ops:
        return "no operator"

    def behind(o: PTOperator) -> tuple[int, int, int]:
        book = app.checkpoints.get(o.id)
        return (book.latest if book is not None else -1,
                app.operator_stats[o.id].last_window_id, o.id)

    op: PTOperator = min(ops, key=behind)
    stats = app.operator_stats[op.id]
    state = op.state.name + ("" if op.ready else ", not set up yet")
    still = (f", its window {format_window_id(stats.last_window_id)} unmoved for "
             f"{(now_ms - stats.window_moved_ms) / 1000:.0f} s"
             if stats.window_moved_ms else ", no window reported yet")
    return (f"operator {op.name!r} ({op.id}) in container {op.container_id}, {state}, "
            f"its last checkpoint {format_window_id(behind(op)[0])}{still}")
