"""Recovery from a lost container: who restarts, from which checkpoint, and in which container.

Apex's cascade, as rules over the plan (no I/O; the caller holds the master's lock): the
lost container is KILLED and a new one (or a ready spare, ``master.spares``) replaces it
and takes its operators; its operators and everything downstream of them restart from
their recovery checkpoints (operators in surviving containers are undeployed first);
upstream operators are not touched, their buffer servers replay. Processes to kill and
launch are queued on the application as ``LauncherAction``s for the master to carry out
outside its lock.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from weir.master import spares
from weir.master.application import Application, LauncherAction, LaunchKind
from weir.master.checkpoints import CheckpointBook, is_operator_done, update_recovery
from weir.master.physical_plan import (
    ContainerState,
    OperatorState,
    PTContainer,
    PTOperator,
    container_id_for,
)
from weir.master.stats import ContainerStatsTracker
from weir.operators.attributes import ProcessingMode
from weir.operators.windows import format_window_id

__all__ = [
    "DEFAULT_MAX_RESTARTS",
    "ContainerLoss",
    "affected_operators",
    "ReplayInvariantBroken",
    "check_replay_invariant",
    "deploy_checkpoint",
    "deploy_checkpoints",
    "deploy_failed",
    "downstream_closure",
    "lose_container",
    "max_restarts",
    "redeploy",
    "resume",
]

_LOGGER = logging.getLogger(__name__)

DEFAULT_MAX_RESTARTS = 5
"""Failures in a row (without a new checkpoint in between) an operator may recover from.

The operator's resolved MAX_RESTARTS attribute decides; this is the fallback for an
operator without it.
"""


@dataclasses.dataclass(frozen=True)
class ContainerLoss:
    """A container given up on; ``replacement_id`` names the one replacing it, if any."""

    container_id: str
    cause: str
    replacement_id: str = ""


def max_restarts(op: PTOperator) -> int:
    return int(op.attributes.get("MAX_RESTARTS", DEFAULT_MAX_RESTARTS))


def deploy_checkpoint(op: PTOperator, book: CheckpointBook,
                      downstream_need: int | None = None) -> int:
    """The checkpoint a restarted ``op`` starts from, by its PROCESSING_MODE.

    AT_LEAST_ONCE: its recovery checkpoint (upstream replays every later window).
    EXACTLY_ONCE: its newest checkpoint not after ``downstream_need`` (the oldest
    checkpoint a restarting reader of it starts from): only the windows in flight are
    replayed, yet every window a reader needs is produced again.
    AT_MOST_ONCE: its newest checkpoint, as Apex does; it then skips to the upstream's
    latest window, and so do its readers (all AT_MOST_ONCE: the plan refuses another mode
    downstream of it).
    """
    if op.processing_mode == ProcessingMode.AT_LEAST_ONCE:
        return op.recovery_window_id
    if op.processing_mode == ProcessingMode.EXACTLY_ONCE and downstream_need is not None:
        return max(book.floor(downstream_need), op.recovery_window_id)
    return max(book.latest, op.recovery_window_id)


class ReplayInvariantBroken(RuntimeError):
    """A recovery plan would let an operator restart past a window a downstream one needs."""


def deploy_checkpoints(app: Application, operators: Sequence[PTOperator]) -> dict[int, int]:
    """The checkpoint each of ``operators`` restarts from, downstream operators first.

    The replay invariant, whatever the processing mode: after a recovery every window
    after a restarting operator's checkpoint is either produced again by its upstream
    operator (which restarts at or before it) or still held by the upstream's buffer
    server (which keeps every window after the committed window). So an operator never
    restarts after the checkpoint any restarting operator it feeds starts from; only
    AT_MOST_ONCE chains skip windows, by their promise.
    """
    restarting = {op.id for op in operators}
    chosen: dict[int, int] = {}
    downstream = app.plan.downstream_map()
    for op_id in reversed(app.plan.topological_ids()):
        if op_id not in restarting:
            continue
        op = app.plan.operators[op_id]
        needs = [need for d in downstream[op_id]
                 if (need := _window_needed(app, app.plan.operators[d], chosen)) is not None]
        chosen[op_id] = deploy_checkpoint(op, app.checkpoints[op_id], min(needs, default=None))
    check_replay_invariant(app, operators, chosen)
    return chosen


def _needs_no_replay(app: Application, reader: PTOperator) -> bool:
    """Done, or AT_MOST_ONCE (it takes the upstream's latest window): nothing is replayed
    to it."""
    return reader.processing_mode == ProcessingMode.AT_MOST_ONCE or is_operator_done(app, reader)


def _window_needed(app: Application, reader: PTOperator, chosen: dict[int, int]) -> int | None:
    """The window after which ``reader`` needs its input again when it restarts, or None if
    it does not restart (done, or AT_MOST_ONCE: it takes the upstream's latest window)."""
    if _needs_no_replay(app, reader):
        return None
    if reader.id in chosen:
        return chosen[reader.id]
    return reader.deploy_window_id if reader.pending else None


def check_replay_invariant(app: Application, operators: Sequence[PTOperator],
                           chosen: dict[int, int]) -> None:
    """Raises ReplayInvariantBroken if ``chosen`` would lose a window (see
    ``deploy_checkpoints``): a restarting operator past what a restarting reader needs, a
    running reader of a restarting operator (its stream would be rewound under it), or a
    reader needing windows its running upstream's buffer server already purged."""
    restarting = {op.id: op for op in operators}
    downstream = app.plan.downstream_map()
    for op in operators:
        start = chosen[op.id]
        for d in downstream[op.id]:
            reader = app.plan.operators[d]
            if _needs_no_replay(app, reader):
                continue
            need = _window_needed(app, reader, chosen)
            if need is None:
                raise ReplayInvariantBroken(
                    f"operator {op.name!r} ({op.id}) restarts while its reader {reader.name!r} "
                    f"({d}) keeps running: the reader would miss or repeat windows")
            if start > need:
                raise ReplayInvariantBroken(
                    f"operator {op.name!r} ({op.id}) would restart after window "
                    f"{format_window_id(start)}, but its reader {reader.name!r} ({d}) restarts "
                    f"after {format_window_id(need)}: windows in between would be lost")
        if op.processing_mode == ProcessingMode.AT_MOST_ONCE:
            continue
        for u in app.plan.upstream_ids(op.id):
            upstream = app.plan.operators[u]
            if u in restarting or is_operator_done(app, upstream):
                continue
            if start < app.committed_window_id:
                raise ReplayInvariantBroken(
                    f"operator {op.name!r} ({op.id}) would restart after window "
                    f"{format_window_id(start)}, but {upstream.name!r} ({u}) keeps only the "
                    f"windows after the committed window "
                    f"{format_window_id(app.committed_window_id)}")


# -- the cascade ------------------------------------------------------------------------------
def affected_operators(app: Application, container: PTContainer) -> list[PTOperator]:
    """The operators of ``container`` and every operator downstream of them, by id.

    Operators that are done (ended, and every downstream operator already recovers from
    after their end) have nothing left to give: they are left out, and so is what lies
    downstream of them only.
    """
    return downstream_closure(app, app.plan.operators_in(container))


def downstream_closure(app: Application, start: Sequence[PTOperator]) -> list[PTOperator]:
    """``start`` and every operator downstream of them, by id, leaving out operators that
    are done and what lies downstream of them only."""
    plan = app.plan
    start = [op for op in start if not is_operator_done(app, op)]
    seen = {op.id for op in start}
    queue = [op.id for op in start]
    downstream_map = plan.downstream_map()
    while queue:
        for downstream_id in downstream_map[queue.pop()]:
            downstream = plan.operators[downstream_id]
            if downstream_id not in seen and not is_operator_done(app, downstream):
                seen.add(downstream_id)
                queue.append(downstream_id)
    return [plan.operators[i] for i in sorted(seen)]


def lose_container(app: Application, container: PTContainer, cause: str, now_ms: int, *,
                   blamed: Sequence[PTOperator] | None = None,
                   fatal: bool = False, dump_threads: bool = False) -> ContainerLoss:
    """Gives up on ``container``: KILLED, its process to be killed, its operators recovered.

    The operators it held are charged a failure (only ``blamed`` ones when the cause is
    an operator's own, e.g. FAILED; the caller has set their ``error``). An operator
    past MAX_RESTARTS failures in a row fails the application instead of recovering. A
    container whose operators are all done is not replaced.

    ``fatal``: the blamed operator's error cannot succeed on retry (its container said
    so: bad SQL, a schema mismatch, an operator that cannot be unpickled). Restarting
    would only repeat it MAX_RESTARTS times, each with a cold Spark, so the application
    fails at once with the error.

    ``dump_threads``: the process still runs but does not answer (silent, blocked): the
    launcher asks it for its threads' stacks before the kill, for its log.
    """
    container.transition(ContainerState.KILLED)
    container.loss_request = None
    container.finished_ms = now_ms
    container.diagnostics = cause
    container.buffer_server_host, container.buffer_server_port = "", 0
    app.launcher_actions.append(LauncherAction(LaunchKind.KILL, container.id, dump_threads))
    for op in app.plan.retired_in(container):
        op.transition(OperatorState.SHUTDOWN)  # a retired operator gone with its process
    if app.terminal:
        container.ended_with_app = True
        _LOGGER.info("app=%s container=%s stopped: %s", app.id, container.id, cause)
        return ContainerLoss(container.id, cause)
    _LOGGER.warning("app=%s container=%s lost: %s", app.id, container.id, cause)
    if container.spare:  # it held nothing: only another spare to launch
        spares.spare_lost(app, container)
        return ContainerLoss(container.id, cause)
    update_recovery(app)
    held = app.plan.operators_in(container)
    live = [op for op in held if not is_operator_done(app, op)]
    if not live:
        _LOGGER.info("app=%s container=%s held no operator with work left (%s); nothing to "
                     "recover", app.id, container.id, [op.name for op in held])
        return ContainerLoss(container.id, cause)
    charged = live if blamed is None else list(blamed)
    for op in charged:
        op.failure_count += 1
        op.failures_in_a_row += 1
        if blamed is None:
            op.error, op.error_ms = f"container {container.id} lost: {cause}", now_ms
    if fatal and blamed:
        culprit = blamed[0]
        _fail_operators(live)
        app.fail(f"operator {culprit.name!r} ({culprit.id}) failed: {culprit.error} (not "
                 "retried: this error cannot succeed on retry)", now_ms)
        return ContainerLoss(container.id, cause)
    over = next((op for op in charged if op.failures_in_a_row > max_restarts(op)), None)
    if over is not None:
        _fail_operators(live)
        app.fail(f"operator {over.name!r} ({over.id}) failed {over.failures_in_a_row} times in "
                 f"a row without a new checkpoint (MAX_RESTARTS={max_restarts(over)}); last "
                 f"error: {over.error}", now_ms)
        return ContainerLoss(container.id, cause)
    replacement = _replace(app, container, held)
    redeploy(app, affected_operators(app, replacement), now_ms, replacement)
    delay = backoff(app, max(op.failures_in_a_row for op in charged))
    app.restart_delay_ms, app.restart_at_ms = delay, now_ms + delay
    app.recoveries += 1
    app.last_recovery_ms = now_ms
    app.last_recovery = (f"container {container.id} lost ({cause}); replaced by "
                         f"{replacement.id}; committed window "
                         f"{format_window_id(app.committed_window_id)}"
                         + (f"; restart delayed {delay / 1000:.1f} s (backoff)" if delay else ""))
    return ContainerLoss(container.id, cause, replacement.id)


def backoff(app: Application, failures_in_a_row: int) -> int:
    """The delay (ms) before a restart after ``failures_in_a_row`` failures without a new
    checkpoint: none for the first, then RESTART_BACKOFF_MILLIS doubling at each further
    one up to RESTART_BACKOFF_MAX_MILLIS (Flink's exponential-delay restart strategy).

    >>> from types import SimpleNamespace
    >>> app = SimpleNamespace(plan=SimpleNamespace(attributes={
    ...     "RESTART_BACKOFF_MILLIS": 1000, "RESTART_BACKOFF_MAX_MILLIS": 5000}))
    >>> [backoff(app, k) for k in range(1, 7)]
    [0, 1000, 2000, 4000, 5000, 5000]
    """
    first = int(app.plan.attributes.get("RESTART_BACKOFF_MILLIS", 1_000))
    longest = int(app.plan.attributes.get("RESTART_BACKOFF_MAX_MILLIS", 60_000))
    if failures_in_a_row <= 1 or first <= 0:
        return 0
    return min(longest, first << min(failures_in_a_row - 2, 40))


def _fail_operators(operators: Sequence[PTOperator]) -> None:
    """The operators of a container given up on for good: FAILED (ended ones stay SHUTDOWN)."""
    for op in operators:
        if op.state != OperatorState.SHUTDOWN:
            op.transition(OperatorState.FAILED)


def deploy_failed(app: Application, container: PTContainer, operator_ids: Sequence[int],
                  message: str, now_ms: int, generation: int = 0) -> ContainerLoss | None:
    """A container could not deploy an operator it was sent (it said so with ReportError).

    The operator never ran, so no heartbeat will report it FAILED and its deploy would be
    repeated for ever: it counts as a failure of that operator, and its container is
    restarted like for any failed operator (a missing or corrupt checkpoint thus ends the
    application once past MAX_RESTARTS, with the container's message). That holds whatever
    else the container said of the operator meanwhile: a heartbeat may already have shown
    it ACTIVE while its ``setup`` ran (not ready); left there, it would stay so, never run
    and never blamed. Errors about operators that run (ready), or about an earlier
    ``generation`` of the deployment, are only recorded. A deploy error that
    cannot succeed on retry (an operator payload that cannot be unpickled) does not come
    here: the container reports the operator FAILED and fatal in its heartbeat instead.
    """
    if app.terminal or container.state == ContainerState.KILLED:
        return None
    op = next((op for i in operator_ids if (op := app.plan.operators.get(i)) is not None
               and op.container_id == container.id and _deploying(op, generation)), None)
    if op is None:
        return None
    op.error, op.error_ms = message, now_ms
    _LOGGER.warning("app=%s container=%s operator=%s (%d) could not be deployed from checkpoint "
                    "%s: %s", app.id, container.id, op.name, op.id,
                    format_window_id(op.deploy_window_id), message)
    return lose_container(app, container, f"operator {op.name!r} ({op.id}) could not be "
                                          f"deployed: {message}", now_ms, blamed=[op])


def _deploying(op: PTOperator, generation: int) -> bool:
    """Whether the failed deployment is ``op``'s current one: its ``generation`` (the
    container says which) is the operator's now, whatever a heartbeat showed meanwhile
    (the earlier deployment, still stopping, may have shown it ready). Without a
    generation (an older container): PENDING_DEPLOY, or ACTIVE but not ready yet."""
    if op.terminal:
        return False
    if generation:
        return generation == op.generation
    return op.state == OperatorState.PENDING_DEPLOY or (
        op.state == OperatorState.ACTIVE and not op.ready)


def _replace(app: Application, lost: PTContainer, held: list[PTOperator]) -> PTContainer:
    """The container taking the place (and the operators) of ``lost``: a ready spare,
    with a new spare queued for launch behind it, else a NEW container queued for launch."""
    replacement = spares.take_ready(app)
    if replacement is not None:
        spares.replenish(app)
        how = "a ready spare"
    else:
        index = app.plan.next_container_index()
        replacement = PTContainer(id=container_id_for(app.id, index), index=index)
        app.plan.containers[replacement.id] = replacement
        app.container_stats[replacement.id] = ContainerStatsTracker()
        app.launcher_actions.append(LauncherAction(LaunchKind.LAUNCH, replacement.id))
        how = "a new container"
    replacement.replaces = lost.id
    lost.replaced_by = replacement.id
    for op in held:
        op.container_id = replacement.id
        replacement.operator_ids.append(op.id)
    _LOGGER.info("app=%s container=%s (%s) replaces %s and takes operators %s", app.id,
                 replacement.id, how, lost.id, [f"{op.name} ({op.id})" for op in held])
    return replacement


def redeploy(app: Application, operators: list[PTOperator], now_ms: int,
             replacement: PTContainer | None = None) -> None:
    """Sends ``operators`` back to PENDING_(UN)DEPLOY with the checkpoint each restarts from:
    PENDING_DEPLOY in ``replacement`` (a new container), PENDING_UNDEPLOY elsewhere.

    A plan that would break the replay invariant (``deploy_checkpoints``) is refused: the
    application fails with the reason rather than lose a window.
    """
    try:
        chosen = deploy_checkpoints(app, operators)
    except ReplayInvariantBroken as exc:
        _LOGGER.error("app=%s recovery refused: %s", app.id, exc)
        _fail_operators(operators)
        app.fail(f"recovery refused, it would lose windows: {exc}", now_ms)
        return
    for op in operators:
        book = app.checkpoints[op.id]
        op.deploy_window_id = chosen[op.id]
        op.generation += 1  # the old deployment is fenced off from here on
        dropped = book.forget_after(op.deploy_window_id)
        op.ready = False
        app.operator_stats[op.id].restarted(now_ms)
        if replacement is not None and op.container_id == replacement.id:
            op.transition(OperatorState.PENDING_DEPLOY)
            how = f"redeploy in {replacement.id}"
        else:
            op.transition(OperatorState.PENDING_UNDEPLOY)
            how = f"undeploy from {op.container_id}, then redeploy"
        _LOGGER.info("app=%s operator=%s (%d) %s as generation %d from checkpoint %s (%s, "
                     "recovery %s)%s", app.id, op.name, op.id, how, op.generation,
                     format_window_id(op.deploy_window_id),
                     op.processing_mode, format_window_id(op.recovery_window_id),
                     f"; forgets newer checkpoints {[format_window_id(w) for w in dropped]}"
                     if dropped else "")


def resume(app: Application, now_ms: int) -> list[tuple[str, int, str]]:
    """A restored application's clocks start over from ``now_ms`` (every container gets a
    fresh heartbeat timeout, a NEW one counts as launched, every operator gets a fresh
    window timeout); returns the
    processes to adopt: ``(container id, pid, host)`` as their last heartbeats said."""
    adopt = []
    for container in app.plan.live_containers():
        stats = app.container_stats[container.id]
        stats.last_heartbeat_ms = now_ms
        container.allocated_ms = now_ms
        if container.state == ContainerState.NEW:
            # queued for launch when the master stopped, launched or not: it has the
            # usual time to call in, or it is lost and recovered (a spare: replaced)
            container.transition(ContainerState.ALLOCATED)
        if stats.pid > 0:
            adopt.append((container.id, stats.pid, stats.host))
    for op in app.plan.operators.values():
        app.operator_stats[op.id].window_moved_ms = now_ms
        op.ready_ms = max(op.ready_ms, now_ms)
        op.deployed_ms = max(op.deployed_ms, now_ms)
    return adopt
