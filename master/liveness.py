"""Liveness: when the master gives up on a container, and why (Apex's master-loop checks).

A container is lost when its own heartbeat asked for it (an operator FAILED there, or
its buffer server failed: a ``LossRequest`` the heartbeat recorded), when its process
exits, when it sends no heartbeat for HEARTBEAT_TIMEOUT_MILLIS, or when it never sends
one within twice that after its launch.
An operator is blocked when its window has not moved for TIMEOUT_WINDOW_COUNT windows
while its input has data, or its setup() has run past SETUP_TIMEOUT_MILLIS (stretched by
the machine's load); its container is then lost too, the operator blamed.

Why HEARTBEAT_TIMEOUT_MILLIS defaults to 10 s (20 heartbeats at the default 500 ms
interval) rather than Apex's 30 s or a couple of seconds: a false alarm costs a whole
recovery (a new container process, a cold Spark JVM of 5-10 s, windows replayed), while
a container's heartbeat thread can legitimately fall silent for a few seconds: a long
Python garbage collection, the GIL held by pyarrow/py4j calls during a heavy Spark
window, or a loaded machine (two cores shared with Spark's JVMs). 10 s stays clear of
those stalls yet bounds detection well below the time a user would wait before acting,
and tests that need quicker detection set the attribute (e.g. 3 s).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from weir.master.application import Application, ApplicationState
from weir.master.physical_plan import ContainerState, OperatorState, PTContainer, PTOperator
from weir.master.recovery import ContainerLoss, lose_container
from weir.operators.watermarks import END_OF_TIME
from weir.operators.windows import format_window_id
from weir.runtime.machine_load import load_stretch

__all__ = [
    "DEFAULT_TIMEOUT_WINDOW_COUNT",
    "blocked_operators",
    "check_liveness",
    "timeout_window_count",
]

_LOGGER = logging.getLogger(__name__)

DEFAULT_TIMEOUT_WINDOW_COUNT = 120
"""Windows an operator's window may stand still while its input has data, when its
TIMEOUT_WINDOW_COUNT is 0 (unset): Apex's default, 1 minute of 500 ms windows..."""
DEFAULT_BLOCKED_FLOOR_MS = 60_000
"""... but never less than a minute: with 200 ms windows 120 are 24 s, less than a cold
first Spark job (skipped warm-up, SPARK_WARMUP_ROWS=0) takes on a loaded 2-core machine,
and a false alarm costs a whole recovery. A user who wants quicker detection sets it."""
BLOCKED_CHECK_INTERVAL_MS = 1_000


def timeout_window_count(op: PTOperator, window_ms: int) -> int:
    """The operator's TIMEOUT_WINDOW_COUNT, or for 0 the default for ``window_ms``."""
    count = int(op.attributes.get("TIMEOUT_WINDOW_COUNT", 0))
    if count:
        return count
    return max(DEFAULT_TIMEOUT_WINDOW_COUNT, -(-DEFAULT_BLOCKED_FLOOR_MS // max(window_ms, 1)))


ACTIVATION_FLOOR_MS = 300_000
"""An operator may activate (start Spark, warm its query up) for its window timeout, but
at least this long: a JVM starting on a loaded machine takes tens of seconds."""


def _stuck_activating(op: PTOperator, window_ms: int, now_ms: int) -> str:
    """Why ``op`` has activated too long to wait for (a JVM that never starts), or ""."""
    limit_ms = max(timeout_window_count(op, window_ms) * window_ms, ACTIVATION_FLOOR_MS)
    activating_ms = now_ms - op.set_up_ms
    if not op.set_up_ms or activating_ms <= limit_ms:
        return ""
    return (f"is blocked: it has been activating (starting Spark, warming its query up) "
            f"for {activating_ms} ms, over {limit_ms} ms (its window timeout, at least "
            f"{ACTIVATION_FLOOR_MS} ms)")


def _stuck_in_setup(app: Application, op: PTOperator, now_ms: int) -> str:
    """Why ``op``'s setup() has run too long to wait for (SETUP_TIMEOUT_MILLIS, stretched
    by the load of this machine, where its container most likely runs), or ""."""
    if not op.deployed_ms:
        return ""
    bound_ms = int(app.attribute("SETUP_TIMEOUT_MILLIS"))
    stretch = load_stretch()
    in_setup_ms = now_ms - op.deployed_ms
    if in_setup_ms <= bound_ms * stretch:
        return ""
    return (f"is blocked: it has been in setup() for {in_setup_ms} ms, over "
            f"SETUP_TIMEOUT_MILLIS={bound_ms} ms"
            + (f" stretched {stretch:.1f}x by the machine's load" if stretch > 1 else ""))


def check_liveness(app: Application, now_ms: int, exit_codes: Mapping[str, int | None],
                   stop_grace_ms: int, waiting: Mapping[str, str] | None = None,
                   exit_reasons: Mapping[str, str] | None = None, *,
                   trouble: str = "") -> list[ContainerLoss]:
    """The containers of ``app`` to give up on now, already marked KILLED and recovered.

    Once the application is terminal, containers that exited are recorded and those
    still running ``stop_grace_ms`` after the end are stopped.

    Args:
        app: the application.
        now_ms: the master's time.
        exit_codes: container id -> exit code, None while running (from the launcher).
        stop_grace_ms: how long containers of an ended application may take to exit.
        waiting: container id -> why its manager has not placed it yet (launched
            containers only): shown in its diagnostics, and its heartbeat is not
            awaited before it runs.
        exit_reasons: container id -> why it ended, where the launcher knows more than
            its exit code (over its memory limit): part of the loss's cause.
        trouble: what keeps the launcher from following its containers (its watch
            failing): shown in each live container's diagnostics until it ends.
    """
    timeout_ms = app.heartbeat_timeout_ms
    losses: list[ContainerLoss] = []
    for container in list(app.plan.containers.values()):  # recovery adds containers
        if container.state == ContainerState.KILLED:
            continue
        request = container.loss_request
        if request is not None:  # its own heartbeat asked (before its process exits)
            blamed = app.plan.operators.get(request.blamed_id)  # type: ignore[arg-type]
            losses.append(lose_container(app, container, request.cause, now_ms,
                                         blamed=None if blamed is None else [blamed],
                                         fatal=request.fatal))
            continue
        _note_placement(container, (waiting or {}).get(container.id, ""), now_ms)
        _note_trouble(container, trouble)
        cause = _cause(app, container, now_ms, exit_codes.get(container.id), timeout_ms,
                       stop_grace_ms, (exit_reasons or {}).get(container.id, ""))
        if cause:  # a process still there when the app runs on: silent, or never called
            losses.append(lose_container(
                app, container, cause, now_ms,
                dump_threads=not app.terminal and exit_codes.get(container.id) is None))
    # Blocked means still for TIMEOUT_WINDOW_COUNT windows (a minute by default): one look
    # a second is plenty, and the look walks every operator of the application.
    if now_ms - app.blocked_checked_ms < BLOCKED_CHECK_INTERVAL_MS:
        return losses
    app.blocked_checked_ms = now_ms
    for op, cause in blocked_operators(app, now_ms):
        container = app.plan.container_of(op.id)
        if app.terminal or container.state == ContainerState.KILLED:
            continue
        _LOGGER.warning("app=%s container=%s operator=%s (%d) %s", app.id, container.id,
                        op.name, op.id, cause)
        op.error, op.error_ms = cause, now_ms
        losses.append(lose_container(app, container, f"operator {op.name!r} ({op.id}) {cause}",
                                     now_ms, blamed=[op], dump_threads=True))
    return losses


WAITING_FOR_PLACEMENT = "waiting to be placed: "


def _note_placement(container: PTContainer, reason: str, now_ms: int) -> None:
    """A launched container its manager has not placed (no node has room) says why in
    its diagnostics, and the time it has to send a first heartbeat starts once it is
    placed: a wait for room is not a silent container, and it is not replaced (a
    replacement would wait for the same room)."""
    if container.state != ContainerState.ALLOCATED:
        return
    if reason:
        container.diagnostics = WAITING_FOR_PLACEMENT + reason
        container.allocated_ms = now_ms
    elif container.diagnostics.startswith(WAITING_FOR_PLACEMENT):
        container.diagnostics = ""


LAUNCHER_TROUBLE = "its launcher cannot follow it: "


def _note_trouble(container: PTContainer, trouble: str) -> None:
    """A launcher that cannot watch its cluster manager says so on every live container
    (an exit may go unseen until the heartbeat timeout), until it can again."""
    if trouble:
        container.diagnostics = LAUNCHER_TROUBLE + trouble
    elif container.diagnostics.startswith(LAUNCHER_TROUBLE):
        container.diagnostics = ""


def _cause(app: Application, container: PTContainer, now_ms: int, exit_code: int | None,
           timeout_ms: int, stop_grace_ms: int, exit_reason: str = "") -> str:
    if app.terminal:
        if container.state == ContainerState.NEW:
            return f"never launched: the application is {app.state.value}"
        if exit_code is not None:
            return f"exited with code {exit_code} after the application ended"
        if now_ms - app.finished_ms >= stop_grace_ms:
            return (f"still running {(now_ms - app.finished_ms) / 1000:.1f} s after the "
                    "application ended; stopped")
        return ""
    if container.state == ContainerState.NEW:
        return ""
    if exit_code is not None:
        return f"its process exited with code {exit_code}" + (
            f": {exit_reason}" if exit_reason else "")
    if container.state == ContainerState.ACTIVE:
        silent_ms = now_ms - app.container_stats[container.id].last_heartbeat_ms
        if silent_ms > timeout_ms:
            return (f"no heartbeat for {silent_ms} ms "
                    f"(HEARTBEAT_TIMEOUT_MILLIS={timeout_ms})")
    elif container.state == ContainerState.ALLOCATED:
        waited_ms = now_ms - container.allocated_ms
        if waited_ms > 2 * timeout_ms:
            return (f"never sent a heartbeat within {waited_ms} ms of its launch "
                    f"(2 x HEARTBEAT_TIMEOUT_MILLIS={timeout_ms})")
    return ""


def blocked_operators(app: Application, now_ms: int) -> list[tuple[PTOperator, str]]:
    """ACTIVE operators whose window stood still too long while data waits for them, or
    whose setup() has run past SETUP_TIMEOUT_MILLIS (stretched by the machine's load).

    An operator is blocked when its window has not moved for TIMEOUT_WINDOW_COUNT
    windows, and:

    - a generic operator: some upstream operator is past its window (its input has
      data), and every upstream operator is ready (one still in ``setup`` or
      ``activate``, warming Spark, holds it back); nor while it activates itself, up to
      its window timeout or ``ACTIVATION_FLOOR_MS`` if longer: past that it is blocked;
    - an input operator: it has been activated and the application is not shutting
      down.

    The windows are counted from when the operator's instance became ready and had
    activated and, once every operator has, from when the last one did, so an operator
    ready early is not blamed for the time a slower one took to warm Spark (three Spark
    JVMs starting on two cores take longer than 120 windows of 300 ms).

    An operator with a downstream operator behind it (or not running) is never blamed:
    it may be held back by that one, which is blamed instead if it is stuck with data.
    Nor is one whose stream ended (its watermark is END_OF_TIME): its window moves no
    more, it waits for its last window's commit, which may take a recovery downstream.
    """
    if app.state != ApplicationState.RUNNING:
        return []
    plan, stats = app.plan, app.operator_stats
    window_ms = int(app.attribute("STREAMING_WINDOW_SIZE_MILLIS"))
    running = [op for op in plan.operators.values() if not op.terminal]
    all_ready = all(op.ready and not op.activating for op in running)
    activation_ms = max((op.ready_ms for op in running), default=0)
    blocked: list[tuple[PTOperator, str]] = []
    downstream: dict[int, list[int]] | None = None  # derived only for a still operator
    for op in plan.operators.values():
        if op.state != OperatorState.ACTIVE:
            continue
        if not op.ready:
            stuck = _stuck_in_setup(app, op, now_ms)
            if stuck:
                blocked.append((op, stuck))
            continue
        if op.activating:
            stuck = _stuck_activating(op, window_ms, now_ms)
            if stuck:
                blocked.append((op, stuck))
            continue
        tracker = stats[op.id]
        if tracker.watermark_ms == END_OF_TIME:
            continue
        count = timeout_window_count(op, window_ms)
        since_ms = max(tracker.window_moved_ms, op.ready_ms)
        if all_ready:
            since_ms = max(since_ms, activation_ms)
        elif op.is_input:
            continue
        if op.is_input and app.shutdown_requested:
            continue
        still_ms = now_ms - since_ms
        if still_ms <= count * window_ms:
            continue
        window = tracker.last_window_id
        if downstream is None:
            downstream = plan.downstream_map()
        if any(plan.operators[d].state != OperatorState.ACTIVE
               or stats[d].last_window_id < window for d in downstream[op.id]):
            continue
        waiting = ""
        if not op.is_input:
            upstream = [plan.operators[u] for u in plan.upstream_ids(op.id)]
            if any(not u.terminal and (u.state != OperatorState.ACTIVE or not u.ready
                                       or u.activating) for u in upstream):
                continue
            ahead = [u for u in upstream if stats[u.id].last_window_id > window]
            if not ahead:
                continue
            waiting = (f" while {ahead[0].name!r} upstream is at window "
                       f"{format_window_id(stats[ahead[0].id].last_window_id)}")
        blocked.append((op, f"is blocked: its window {format_window_id(window)} has not moved "
                            f"for {still_ms} ms (TIMEOUT_WINDOW_COUNT={count} windows of "
                            f"{window_ms} ms){waiting}"))
    return blocked
