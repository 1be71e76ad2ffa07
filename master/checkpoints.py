"""Checkpoints, recovery checkpoints and the committed window: Apex's rules as pure functions.

The master records every checkpoint an operator reports and derives two things from
them: each operator's recovery checkpoint (where it restarts if it is lost, chosen so
that every downstream operator can be fed again from buffer-server replay) and the
committed window (the minimum of those: every window up to it is done for good, so
containers may purge it). No I/O: the master never deletes a checkpoint itself, the
containers do once they hear of the committed window.

>>> book = CheckpointBook()
>>> [book.add(w) for w in (40, 20, 40, 60)]
[True, True, False, True]
>>> book.windows, book.latest, book.floor(50)
([20, 40, 60], 60, 40)
>>> nodes = {1: RecoveryNode(downstream=(2,), checkpoints=(20, 40, 60)),
...          2: RecoveryNode(checkpoints=(20, 40))}
>>> recovery = recovery_checkpoints(nodes)
>>> recovery, committed_window(recovery)
({2: 40, 1: 40}, 40)
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from weir.master.checkpoint_book import CheckpointBook  # (journals name it here)
from weir.master.physical_plan import OperatorState, PTOperator, Topology
from weir.operators.windows import NO_WINDOW, format_window_id
from weir.runtime.committed import committed_window
from weir.runtime.committed import is_done as ended_and_checkpointed

if TYPE_CHECKING:
    from weir.master.application import Application
    from weir.master.report_filter import ReportedWindow

__all__ = [
    "CheckpointBook",
    "RecoveryNode",
    "committed_window",
    "is_done",
    "is_operator_done",
    "record_checkpoints",
    "recovery_checkpoints",
    "update_recovery",
]

_LOGGER = logging.getLogger(__name__)


class RecoveryNode(NamedTuple):
    """One operator as the recovery computation sees it (a tuple: one is made per
    operator of the application on every checkpoint report).

    Attributes:
        downstream: ids of the operators it feeds.
        checkpoints: its checkpoints, ascending (-1, the initial state, is implied).
        previous: its current recovery checkpoint; the new one is never older.
        frozen: it is between instances (pending deploy or undeploy): its recovery
            checkpoint is the one it is being redeployed from and must not move.
        ended_window: its last window if it has ended (SHUTDOWN after END_STREAM): it
            counts as checkpointed there. None while it may still process windows.
    """

    downstream: tuple[int, ...] = ()
    checkpoints: Sequence[int] = ()
    previous: int = NO_WINDOW
    frozen: bool = False
    ended_window: int | None = None


def recovery_checkpoints(nodes: Mapping[int, RecoveryNode],
                         downstream_first: Sequence[int] | None = None) -> dict[int, int]:
    """Every operator's recovery checkpoint.

    recovery(op) = the newest checkpoint of op not after min(recovery(d)) over its
    downstream operators d that are not done (``is_done``: never rerun, they need nothing
    of it again); a leaf, or an operator feeding only done ones, gets its newest
    checkpoint. Never older than ``previous``; exactly ``previous`` while ``frozen``.

    An operator restarted after its readers ended (lost between the commit of its last
    window and its own teardown) runs on to its end again: no done reader may hold its
    new windows back from being committed.

    ``downstream_first``, if known, lists the ids each after all its downstream ones.

    Raises:
        ValueError: the operators form a cycle, or name an unknown downstream operator.
    """
    result: dict[int, int] = {}
    order = _downstream_first(nodes) if downstream_first is None else downstream_first
    for op_id in order:
        node = nodes[op_id]
        result[op_id] = recovery_of(node, [result[d] for d in node.downstream
                                           if not is_done(nodes[d], result[d])])
    return result


def recovery_of(node: RecoveryNode, downstream: Sequence[int]) -> int:
    """One operator's recovery checkpoint, given those of its downstream operators that
    are not done (the rule of ``recovery_checkpoints``)."""
    if node.frozen:
        return node.previous
    bound = min(downstream) if downstream else None
    candidates = [NO_WINDOW, *node.checkpoints]
    if node.ended_window is not None:
        candidates.append(node.ended_window)
    best = max(c for c in candidates if bound is None or c <= bound)
    return max(best, node.previous)


def _downstream_first(nodes: Mapping[int, RecoveryNode]) -> list[int]:
    """Operator ids, each after all its downstream operators (iterative: any DAG depth).

    Raises:
        ValueError: a cycle, or an unknown downstream operator.
    """
    order: list[int] = []
    state: dict[int, int] = {}  # 1 = on the path, 2 = done
    for root in nodes:
        if root in state:
            continue
        stack = [(root, iter(nodes[root].downstream))]
        state[root] = 1
        while stack:
            op_id, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                state[op_id] = 2
                order.append(op_id)
            elif child not in nodes:
                raise ValueError(f"unknown downstream operator {child}")
            elif state.get(child) == 1:
                raise ValueError(f"operator {child} is in a cycle; checkpoint groups are not "
                                 "supported")
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(nodes[child].downstream)))
    return order


def is_done(node: RecoveryNode, recovery: int) -> bool:
    """An ended operator whose every downstream operator is past its end: never rerun."""
    return ended_and_checkpointed(node.ended_window, recovery)


# -- an application's books, on every heartbeat ------------------------------------------
def record_checkpoints(app: Application, op: PTOperator,
                       windows: Sequence[ReportedWindow]) -> bool:
    """Adds the checkpoints of a report's ``windows`` to ``op``'s book.

    A checkpoint newer than any the operator ever saved is progress: its failures in a
    row start over. Returns whether any checkpoint was new.
    """
    book = app.checkpoints[op.id]
    added = False
    for window in windows:
        checkpoint = window.checkpoint
        if checkpoint is None:
            continue
        window_id = checkpoint.window_id
        high_water = book.high_water
        if not book.add(window_id, checkpoint.time_ms, checkpoint.start_ms,
                        checkpoint.size_bytes):
            continue
        added = True
        if _LOGGER.isEnabledFor(logging.DEBUG):  # formatting ids costs, on every heartbeat
            _LOGGER.debug("app=%s operator=%s (%d) checkpoint %s (%d ms)", app.id, op.name,
                          op.id, format_window_id(window_id), checkpoint.time_ms)
        if window_id > high_water and op.failures_in_a_row:
            _LOGGER.info("app=%s operator=%s (%d) checkpointed %s: its %d failure(s) in a row "
                         "are forgiven", app.id, op.name, op.id, format_window_id(window_id),
                         op.failures_in_a_row)
            op.failures_in_a_row = 0
    return added


def _recovery_node(app: Application, op: PTOperator, downstream: tuple[int, ...]
                   ) -> RecoveryNode:
    return RecoveryNode(
        downstream=downstream,
        checkpoints=tuple(app.checkpoints[op.id].windows),
        previous=op.recovery_window_id,
        frozen=op.pending,
        ended_window=(app.operator_stats[op.id].current_window_id
                      if op.state == OperatorState.SHUTDOWN else None))


def update_recovery(app: Application, checkpointed: Iterable[int] | None = None) -> None:
    """Recomputes the recovery checkpoints and the committed window from the books.

    ``checkpointed``: only these operators' books got new checkpoints since the last
    update, and no operator changed state. Then only they, and the operators upstream of
    them, are recomputed, downstream first and only as far as a recovery checkpoint moves
    (each depends on nothing but its own book and its downstream operators'): the same
    result as recomputing all, at the cost of what moved, where a whole walk per heartbeat
    with a checkpoint cost a master of 10,000 operators most of its CPU. None: all.

    Checkpoints older than an operator's recovery checkpoint are forgotten here (never
    needed again); the files are the containers' to delete once committed.
    """
    topology = app.plan.topology()
    if checkpointed is None:
        moved = _update_all(app, topology)
    else:
        moved = _update_from(app, topology, checkpointed)
    if not moved:
        return
    operators = app.plan.operators.values()
    ended = {op.id: app.operator_stats[op.id].current_window_id
             for op in operators if op.state == OperatorState.SHUTDOWN}
    committed = committed_window({op.id: op.recovery_window_id for op in operators}, ended)
    if committed > app.committed_window_id:
        _LOGGER.info("app=%s committed window %s", app.id, format_window_id(committed))
        app.committed_window_id = committed


def _update_all(app: Application, topology: Topology) -> bool:
    nodes = {op.id: _recovery_node(app, op, topology.downstream[op.id])
             for op in app.plan.operators.values()}
    recovery = recovery_checkpoints(nodes, topology.order[::-1])
    for op_id, window_id in recovery.items():
        _set_recovery(app, app.plan.operators[op_id], window_id)
    return True


def _update_from(app: Application, topology: Topology, checkpointed: Iterable[int]) -> bool:
    """Recomputes ``checkpointed`` and, while their recovery checkpoints move, the
    operators upstream of them; returns whether any moved."""
    operators = app.plan.operators
    pending = [(-topology.position[op_id], op_id) for op_id in set(checkpointed)
               if op_id in operators]
    heapq.heapify(pending)  # downstream first: the highest position in the order
    queued = {op_id for _, op_id in pending}
    moved = False
    while pending:
        _, op_id = heapq.heappop(pending)
        op = operators[op_id]
        downstream = topology.downstream[op_id]
        window_id = recovery_of(_recovery_node(app, op, downstream),
                                [operators[d].recovery_window_id for d in downstream
                                 if not is_operator_done(app, operators[d])])
        if not _set_recovery(app, op, window_id):
            continue
        moved = True
        for up in topology.upstream[op_id]:
            if up not in queued:
                queued.add(up)
                heapq.heappush(pending, (-topology.position[up], up))
    return moved


def _set_recovery(app: Application, op: PTOperator, window_id: int) -> bool:
    """Sets ``op``'s recovery checkpoint; returns whether it moved."""
    app.touched(op.id)  # its book is pruned, its window may move: journal it
    app.checkpoints[op.id].prune_before(window_id)
    if window_id == op.recovery_window_id:
        return False
    if _LOGGER.isEnabledFor(logging.DEBUG):
        _LOGGER.debug("app=%s operator=%s (%d) recovery checkpoint %s", app.id, op.name,
                      op.id, format_window_id(window_id))
    op.recovery_window_id = window_id
    return True


def is_operator_done(app: Application, op: PTOperator) -> bool:
    """Ended, and every downstream operator recovers from after its end: never rerun."""
    if op.state != OperatorState.SHUTDOWN:
        return False
    end = app.operator_stats[op.id].current_window_id
    return is_done(RecoveryNode(ended_window=end), op.recovery_window_id)
