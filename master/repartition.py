"""Repartitioning a running operator: Apex's ``redoPartitions``, as rules over the plan.

No I/O; the caller holds the master's lock. The operator's partitions (and the unifiers
merging them) are replaced by new ones with new ids: the plan is instantiated again
from the DAG with the new count, operators of other DAG operators keep their ids and
places, and a reader whose inputs change restarts like in a recovery, with everything
downstream of it, from its recovery checkpoint. The new partitions start at the old
partitions' minimum recovery checkpoint: their first state is the old partitions' states
there, merged and cut to each new partition's keys (``StateSeed``; the container that
deploys a partition builds it, ``operators.keyed_state``), and the upstream buffer
servers replay every later window to them. The old ones are undeployed first (an old
and a new instance never write at once), and their checkpoints are deleted once the
committed window has passed the new partitions' start.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from weir.master.application import Application, ApplicationState
from weir.master.checkpoints import CheckpointBook, update_recovery
from weir.master.errors import FailedPrecondition, InvalidArgument, NotFound, PlanError, shown
from weir.master.physical_plan import (
    ContainerState,
    OperatorState,
    PTContainer,
    PTOperator,
    StateSeed,
)
from weir.master.planner import check_size, instance_names, instantiate, spread
from weir.master.recovery import downstream_closure, redeploy
from weir.master.stats import OperatorStatsTracker
from weir.operators.attributes import ATTRIBUTES, ProcessingMode
from weir.operators.windows import format_window_id
from weir.proto import plan_pb2

__all__ = ["MAX_PARTITIONS", "Repartition", "repartition", "unhealthy"]

_MAX_OPERATORS = ATTRIBUTES["MAX_OPERATORS"].default  # a plan journaled before the attribute

_LOGGER = logging.getLogger(__name__)

MAX_PARTITIONS = 256
"""The most partitions one operator may have (each is a thread and a Spark job a window)."""


@dataclasses.dataclass(frozen=True)
class Repartition:
    """What a repartition did: the partitions replaced and made, the window the new ones
    start from, and the operators downstream that restart."""

    operator: str
    old: tuple[str, ...]
    new: tuple[str, ...]
    start_window_id: int
    restarted: tuple[str, ...]

    def describe(self) -> str:
        return (f"operator {self.operator!r}: {len(self.old)} -> {len(self.new)} partitions "
                f"from checkpoint {format_window_id(self.start_window_id)}"
                + (f"; {', '.join(self.restarted)} restart" if self.restarted else ""))


def unhealthy(app: Application) -> str | None:
    """Why ``app`` cannot be repartitioned now, or None: it must be RUNNING with every
    container ACTIVE and every operator running (no recovery or repartition under way)."""
    if app.state != ApplicationState.RUNNING:
        return f"application {app.id} is {app.state.value}, not RUNNING"
    if app.shutdown_requested:
        return f"application {app.id} is shutting down"
    if not app.all_containers_active():
        return f"application {app.id} has containers that are not ACTIVE yet"
    busy = [op.name for op in [*app.plan.operators.values(), *app.plan.retired.values()]
            if op.pending]
    if busy:
        return f"operators {busy[:5]} of application {app.id} are being (re)deployed"
    return None


def repartition(app: Application, operator: str, count: int, now_ms: int,
                cause: str = "asked by hand") -> Repartition:
    """Gives DAG operator ``operator`` ``count`` partitions while ``app`` runs.

    Raises:
        NotFound: no such operator in the DAG.
        InvalidArgument: a count out of range, or no PARTITION_KEY to split by.
        FailedPrecondition: the application is not healthy now, or the operator cannot
            be repartitioned (a source, parallel partitions, state outside checkpoints,
            already that many partitions, ended).
    """
    _check(app, operator, count)
    plan = app.plan
    old = plan.instances(operator)
    start = min(op.recovery_window_id for op in old)
    attributes, counts = _attributes(app, operator, count), _counts(app, operator, count)
    try:
        check_size(app.dag, counts, attributes,
                   int(plan.attributes.get("MAX_OPERATORS", _MAX_OPERATORS)))
    except PlanError as exc:
        raise InvalidArgument(str(exc)) from None
    fresh = instantiate(app.dag, attributes, counts, app.id, _placement(app, operator, count))
    changing = _changing(fresh, operator)
    names = {op.name for op in fresh.values() if op.id not in changing}
    old_changing = _changing(plan.operators, operator)
    replaced = [op for op in plan.operators.values()
                if op.id in old_changing or op.name not in names]
    retired_ids = _retired_ids(replaced)
    ids: dict[int, int] = {}  # provisional id -> final id
    next_id = plan.next_operator_id()
    for op in fresh.values():
        if op.id in changing:
            ids[op.id], next_id = next_id, next_id + 1
        else:
            kept = plan.operator_by_name(op.name)
            if kept is None:
                raise RuntimeError(f"repartition: the new plan has operator {op.name!r} that "
                                   "the running plan lacks")
            ids[op.id] = kept.id
    for op in replaced:
        _retire(app, op)
    made: list[PTOperator] = []
    rewired: list[PTOperator] = []
    for op in fresh.values():
        inputs = [dataclasses.replace(link, source_operator_id=ids[link.source_operator_id])
                  for link in op.inputs]
        if op.id in changing:
            made.append(_add(app, dataclasses.replace(op, id=ids[op.id], inputs=inputs),
                             start, old if op.type != plan_pb2.OPERATOR_TYPE_UNIFIER else [],
                             retired_ids))
            continue
        kept = plan.operators[ids[op.id]]
        if kept.inputs != inputs:
            kept.inputs = inputs
            rewired.append(kept)
    plan.reshaped()
    new_ids = {op.id for op in made}
    restart = [op for op in downstream_closure(app, [*rewired, *made]) if op.id not in new_ids]
    redeploy(app, restart, now_ms)
    update_recovery(app)
    result = Repartition(operator, tuple(op.name for op in old),
                         tuple(op.name for op in made if op.logical_name == operator), start,
                         tuple(op.name for op in restart))
    app.repartitions += 1
    app.last_repartition = f"{result.describe()} ({cause})"
    app.last_repartition_ms = now_ms
    _LOGGER.info("app=%s repartition (%s): %s; new %s, retired %s", app.id, cause,
                 result.describe(), [f"{op.name} ({op.id}) in {op.container_id}" for op in made],
                 [f"{op.name} ({op.id})" for op in replaced])
    return result


def _check(app: Application, operator: str, count: int) -> None:
    descriptors = {op.name: op for op in app.dag.operators}
    desc = descriptors.get(operator)
    if desc is None:
        raise NotFound(f"application {app.id} has no operator {shown(operator)} in its DAG; "
                       f"the operators are {sorted(descriptors)}")
    if not 1 <= count <= MAX_PARTITIONS:
        raise InvalidArgument(f"{count} partitions: give 1 to {MAX_PARTITIONS}")
    if desc.kind == plan_pb2.OPERATOR_KIND_INPUT:
        raise FailedPrecondition(f"operator {operator!r} is a source: sources cannot be "
                                 "repartitioned; repartition the operators it feeds")
    if desc.repartition_refusal:
        raise FailedPrecondition(f"operator {operator!r} cannot be repartitioned: "
                                 f"{desc.repartition_refusal}")
    instances = app.plan.instances(operator)
    attributes = instances[0].attributes
    if count > 1 and not attributes.get("PARTITION_KEY"):
        raise InvalidArgument(f"operator {operator!r} has no PARTITION_KEY to split its "
                              "streams by; submit the application with "
                              f"-D {operator}.PARTITION_KEY=<column>")
    followers = [op.name for op in app.plan.operators.values()
                 if op.attributes.get("PARALLEL_PARTITION") and any(
                     app.plan.operators[link.source_operator_id].logical_name == operator
                     for link in op.inputs)]
    if attributes.get("PARALLEL_PARTITION") or followers:
        chain = [operator, *followers]
        raise FailedPrecondition(f"operators {chain} are parallel partitions "
                                 "(PARALLEL_PARTITION); repartitioning those is not supported "
                                 "yet")
    if instances[0].processing_mode == ProcessingMode.AT_MOST_ONCE:
        raise FailedPrecondition(f"operator {operator!r} is AT_MOST_ONCE: new partitions would "
                                 "skip the windows since the old ones' checkpoint; "
                                 "repartition AT_LEAST_ONCE or EXACTLY_ONCE operators")
    if len(instances) == count:
        raise FailedPrecondition(f"operator {operator!r} already has {count} partition(s)")
    reason = unhealthy(app)
    if reason is not None:
        raise FailedPrecondition(f"cannot repartition {operator!r} now: {reason}; try again "
                                 "when `weir app` shows every operator ACTIVE")
    ended = [op.name for op in instances if op.state != OperatorState.ACTIVE]
    if ended:
        raise FailedPrecondition(f"partitions {ended} of {operator!r} are not ACTIVE (their "
                                 "stream ended): nothing is left to repartition")


def _changing(operators: Mapping[int, PTOperator], operator: str) -> set[int]:
    """The ids a repartition of ``operator`` replaces: its partitions, the unifiers merging
    them, and the unifiers feeding them (each takes its reader's share of a partitioned
    upstream)."""
    unifier = plan_pb2.OPERATOR_TYPE_UNIFIER
    instances = {op.id for op in operators.values()
                 if op.logical_name == operator and op.type != unifier}
    changing = set(instances)
    for op in operators.values():
        if op.type == unifier and any(link.source_operator_id in instances
                                      for link in op.inputs):
            changing.add(op.id)
        if op.id in instances:
            changing.update(link.source_operator_id for link in op.inputs
                            if operators[link.source_operator_id].type == unifier)
    return changing


def _retired_ids(replaced: list[PTOperator]) -> tuple[int, ...]:
    """The operators whose checkpoints the new ones' containers delete after the commit:
    those replaced now, and those an earlier repartition replaced that may not be deleted
    yet (their new partitions are replaced before the commit passed their start)."""
    ids = [op.id for op in replaced]
    ids += [i for op in replaced if op.seed is not None for i in op.seed.retired_ids]
    return tuple(dict.fromkeys(ids))


def _attributes(app: Application, operator: str, count: int) -> dict[str, dict]:
    """Every DAG operator's resolved attributes, as its instances have them."""
    attributes = {}
    for desc in app.dag.operators:
        attributes[desc.name] = dict(app.plan.instances(desc.name)[0].attributes)
    attributes[operator]["PARTITIONS"] = count
    return attributes


def _counts(app: Application, operator: str, count: int) -> dict[str, int]:
    counts = {desc.name: len(app.plan.instances(desc.name)) for desc in app.dag.operators}
    counts[operator] = count
    return counts


def _placement(app: Application, operator: str, count: int) -> dict[str, int]:
    """Container index per instance name: others where they run; the new partitions in
    the container the operator is pinned to (CONTAINER, or the one that replaced it), else
    on the least loaded live containers, each on another one while there are enough."""
    placement = {op.name: app.plan.containers[op.container_id].index
                 for op in app.plan.operators.values() if op.logical_name != operator}
    pinned = _pinned(app, int(app.plan.instances(operator)[0].attributes.get("CONTAINER", -1)))
    if pinned is not None:
        placement.update((name, pinned.index) for name in instance_names(operator, count))
        return placement
    load = {c.index: sum(op.logical_name != operator for op in app.plan.operators_in(c))
            for c in app.plan.working_containers() if c.state == ContainerState.ACTIVE}
    placement.update(spread(instance_names(operator, count), load))
    return placement


def _pinned(app: Application, index: int) -> PTContainer | None:
    """The live container that is (or replaced) container number ``index``, if any."""
    container = next((c for c in app.plan.containers.values() if c.index == index), None)
    while container is not None and container.replaced_by:
        container = app.plan.containers.get(container.replaced_by)
    if container is None or container.state != ContainerState.ACTIVE:
        return None
    return container


def _retire(app: Application, op: PTOperator) -> None:
    """Out of the plan, to be undeployed from its container (all are ACTIVE: ``_check``)."""
    del app.plan.operators[op.id]
    app.checkpoints.pop(op.id, None)
    app.plan.retired[op.id] = op
    op.ready = False
    op.transition(OperatorState.PENDING_UNDEPLOY)


def _add(app: Application, op: PTOperator, start: int, sources: list[PTOperator],
         retired_ids: tuple[int, ...]) -> PTOperator:
    """A new operator of the plan, pending deploy from ``start`` with its seed."""
    op.state = OperatorState.PENDING_DEPLOY
    op.generation = app.plan.first_generation
    op.deploy_window_id = op.recovery_window_id = start
    op.seed = StateSeed(start, tuple(o.id for o in sources),
                        op.share if sources else None, retired_ids)
    book = CheckpointBook()
    book.add(start)  # built by its container before it runs (no-op for -1: fresh)
    app.plan.operators[op.id] = op
    app.checkpoints[op.id] = book
    app.operator_stats[op.id] = OperatorStatsTracker()
    app.plan.containers[op.container_id].operator_ids.append(op.id)
    return op
