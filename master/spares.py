"""Spare containers (SPARE_CONTAINERS): warm standbys that a lost container's operators go to.

Recovery onto a new process pays for a cold start (a process, a SparkSession and its JIT
warm-up: seconds), so an application may keep spares: containers launched with it that
hold no operators, start their SparkSession at once when the DAG uses Spark, and say in
their heartbeats when it is warm. When a container is lost, ``recovery`` gives its
operators to a ready spare instead of a new container (the same recovery: checkpoints,
generations and the replay invariant do not care which container deploys), and a new
spare is launched in the background. Pure rules over the plan, like ``recovery``; the
caller holds the master's lock and carries out the queued launches.
"""

from __future__ import annotations

import logging

from weir.master.application import Application, LauncherAction, LaunchKind
from weir.master.physical_plan import ContainerState, PhysicalPlan, PTContainer, container_id_for
from weir.master.stats import ContainerStatsTracker
from weir.proto import plan_pb2

__all__ = [
    "SPARE_HEARTBEAT_INTERVAL_MS",
    "SPARE_LOSSES_IN_A_ROW",
    "add_spares",
    "is_ready",
    "record_warmth",
    "replenish",
    "spare_lost",
    "take_ready",
    "runs_spark",
    "uses_spark",
]

_LOGGER = logging.getLogger(__name__)

SPARE_HEARTBEAT_INTERVAL_MS = 100
"""How often a spare heartbeats until it is given operators: deploys reach a container
only in heartbeat replies, so this bounds how long a recovery waits for the spare to hear
of its operators (a few small heartbeats a second per spare cost the master little)."""

SPARE_LOSSES_IN_A_ROW = 3
"""Spares lost before they ever became ready, in a row, after which no more are launched
(say Spark cannot start on this host): recovery then launches replacements as without
spares, instead of the master relaunching a failing spare for ever."""


def uses_spark(dag: plan_pb2.DagDescriptor) -> bool:
    """Whether any operator (or its unifier) of the DAG runs window logic in Spark."""
    return any(op.uses_spark for op in dag.operators)


def runs_spark(app: Application, container: PTContainer) -> bool:
    """Whether an operator placed in ``container`` (or its unifier) runs window logic in
    Spark: the container then starts its SparkSession as it starts."""
    spark = {op.name for op in app.dag.operators if op.uses_spark}
    operators = app.plan.operators
    return any(operators[i].logical_name in spark for i in container.operator_ids
               if i in operators)


def wanted(app: Application) -> int:
    """SPARE_CONTAINERS: how many live spares the application keeps."""
    return int(app.plan.attributes.get("SPARE_CONTAINERS", 0))


def add_spares(plan: PhysicalPlan, count: int) -> list[PTContainer]:
    """``count`` NEW spare containers added to ``plan`` after its other containers."""
    added = []
    for _ in range(count):
        index = plan.next_container_index()
        spare = PTContainer(id=container_id_for(plan.app_id, index), index=index, spare=True)
        plan.containers[spare.id] = spare
        added.append(spare)
    return added


def is_ready(app: Application, container: PTContainer) -> bool:
    """A spare that can take operators now: ACTIVE (heartbeating, its buffer server up)
    and, when the application uses Spark, warm."""
    return (container.spare and container.state == ContainerState.ACTIVE
            and (container.spark_warm or not uses_spark(app.dag)))


def record_warmth(app: Application, container: PTContainer, spark_warm: bool) -> None:
    """Notes what a heartbeat says of the container's Spark; a spare that just became
    ready clears the count of spares lost before being ready."""
    was_ready = is_ready(app, container)
    container.spark_warm = spark_warm
    if container.spare and not was_ready and is_ready(app, container):
        app.spare_losses_in_a_row = 0
        _LOGGER.info("app=%s container=%s spare ready%s", app.id, container.id,
                     " (its Spark is warm)" if spark_warm else "")


def take_ready(app: Application) -> PTContainer | None:
    """The longest-ready spare, no longer a spare (the caller gives it operators), or None."""
    ready = [c for c in app.plan.live_containers() if is_ready(app, c)]
    if not ready:
        return None
    spare = min(ready, key=lambda c: (c.activated_ms, c.index))
    spare.spare = False
    return spare


def replenish(app: Application) -> list[PTContainer]:
    """New spares, queued for launch, until the application has SPARE_CONTAINERS live
    ones; none once it ended or after ``SPARE_LOSSES_IN_A_ROW`` spares failed to start."""
    if app.terminal or app.spare_losses_in_a_row >= SPARE_LOSSES_IN_A_ROW:
        return []
    live = sum(c.spare for c in app.plan.live_containers())
    added = add_spares(app.plan, max(0, wanted(app) - live))
    for spare in added:
        app.container_stats[spare.id] = ContainerStatsTracker()
        app.launcher_actions.append(LauncherAction(LaunchKind.LAUNCH, spare.id))
        _LOGGER.info("app=%s container=%s new spare, to be launched", app.id, spare.id)
    return added


def spare_lost(app: Application, container: PTContainer) -> None:
    """A spare was lost (call it marked KILLED): another replaces it, unless spares keep
    failing before they are ready (then recovery goes on without them, and says so)."""
    if app.terminal:
        return
    was_ready = container.activated_ms > 0 and (container.spark_warm
                                                or not uses_spark(app.dag))
    if not was_ready:
        app.spare_losses_in_a_row += 1
        if app.spare_losses_in_a_row == SPARE_LOSSES_IN_A_ROW:
            message = (f"{SPARE_LOSSES_IN_A_ROW} spare containers in a row were lost "
                       f"before they were ready (last: {container.id}, "
                       f"{container.diagnostics}); no more spares are launched, lost "
                       "containers are replaced by new ones")
            app.report_error("master", message, container.finished_ms)
            _LOGGER.warning("app=%s %s", app.id, message)
    for new in replenish(app)[:1]:
        container.replaced_by, new.replaces = new.id, container.id
