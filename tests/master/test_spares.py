"""Spare containers (SPARE_CONTAINERS), stepped by hand: planned and launched with the
application, a lost container's operators given to a ready spare, a new spare launched
behind it, and the bookkeeping through the views, the end of the application and a
master restart."""

from __future__ import annotations

import pytest

from tests.master.cluster import (
    ABORT,
    C0,
    C1,
    C2,
    C3,
    RELAY,
    SHUTDOWN,
    SINK,
    SOURCE,
    Cluster,
    checkpointed,
)
from tests.master.fakes import ManualClock, chain_descriptor, container_heartbeat
from weir.master import spares, tables
from weir.master.application import ApplicationState
from weir.master.core import MasterCore
from weir.master.errors import PlanError
from weir.master.heartbeat import container_context
from weir.master.launcher import RecordingLauncher
from weir.master.persistence import ApplicationJournal
from weir.master.physical_plan import ContainerState, OperatorState
from weir.master.planner import build_physical_plan
from weir.master.views import application_info, container_info
from weir.operators import Dag
from weir.operators.attributes import InvalidAttribute
from weir.proto import plan_pb2

pytestmark = pytest.mark.timeout(30)

C4, C5 = "app-0001-c4", "app-0001-c5"


def _descriptor(spark: bool) -> plan_pb2.DagDescriptor:
    descriptor = chain_descriptor(3)
    descriptor.operators[1].uses_spark = spark  # the relay runs its window logic in Spark
    return descriptor


def spared(*, spark: bool = True, spare_ready: bool = True, count: int = 1) -> Cluster:
    """The chain source (c0) -> relay1 (c1) -> sink (c2) running, with ``count`` spares
    (c3...) that heartbeated (warm, if ``spare_ready``)."""
    cluster = Cluster(_descriptor(spark), 3, SPARE_CONTAINERS=str(count))
    cluster.deploy_all()
    for index in range(3, 3 + count):
        warm(cluster, f"app-0001-c{index}", spare_ready)
    return cluster


def warm(cluster: Cluster, cid: str, spark_warm: bool = True):
    return cluster.beat(cid, spark_warm=spark_warm)


def test_spares_are_planned_after_the_plan_and_the_application_does_not_wait_for_them():
    cluster = Cluster(_descriptor(spark=True), 3, SPARE_CONTAINERS="2")
    plan = cluster.app.plan
    assert [c.id for c in plan.containers.values() if c.spare] == [C3, C4]
    assert all(not c.operator_ids for c in plan.containers.values() if c.spare)
    assert {op.container_id for op in cluster.ops.values()} == {C0, C1, C2}
    for cid in (C0, C1, C2):  # the spares never call in: the application runs all the same
        cluster.beat(cid)
    for op in cluster.ops.values():
        assert [i.id for i in cluster.beat(op.container_id).deploy_request] == [op.id]
        cluster.report(op.id)
    assert cluster.app.state == ApplicationState.RUNNING


def test_a_spare_is_told_to_warm_spark_and_to_heartbeat_often_when_the_dag_uses_spark():
    for spark in (True, False):
        cluster = Cluster(_descriptor(spark), 3, SPARE_CONTAINERS="1",
                          HEARTBEAT_INTERVAL_MILLIS="500")
        spare = container_context(cluster.app, cluster.app.plan.containers[C3])
        assert (spare.spare, spare.warm_spark) == (True, spark)
        assert spare.spare_heartbeat_interval_millis == spares.SPARE_HEARTBEAT_INTERVAL_MS
        plain = container_context(cluster.app, cluster.app.plan.containers[C1])
        assert (plain.spare, plain.warm_spark, plain.spare_heartbeat_interval_millis) == (
            False, False, 0)


def test_a_container_given_spark_operators_is_told_to_start_spark_as_it_starts():
    cluster = Cluster(_descriptor(spark=True), 3, SPARE_CONTAINERS="1")
    told = {cid: container_context(cluster.app, container).start_spark
            for cid, container in cluster.app.plan.containers.items()}
    assert told == {C0: False, C1: True, C2: False, C3: False}  # the relay is in c1
    plain = Cluster(_descriptor(spark=False), 3)
    assert not any(container_context(plain.app, container).start_spark
                   for container in plain.app.plan.containers.values())


def test_a_spare_is_ready_once_active_and_warm_and_the_views_say_so():
    cluster = spared(spare_ready=False)
    spare = cluster.app.plan.containers[C3]
    assert spare.state == ContainerState.ACTIVE and not spares.is_ready(cluster.app, spare)
    assert container_info(cluster.app, spare).state == "SPARE_STARTING"
    warm(cluster, C3)
    assert spares.is_ready(cluster.app, spare)
    info = container_info(cluster.app, spare)
    assert (info.state, info.spare, info.spark_warm, list(info.operator_ids)) == (
        "SPARE", True, True, [])
    app = application_info(cluster.app)
    assert (app.containers_spare, app.containers_planned, app.containers_active) == (1, 4, 4)
    now = cluster.clock()
    assert tables.container_rows([info], now)[0][:3] == [C3, "app-0001", "SPARE"]
    assert "4 active of 4 (0 replaced, 1 spare)" in tables.application_details(app, now)
    without_spark = spared(spark=False, spare_ready=False)  # no Spark to warm: ready at once
    assert spares.is_ready(without_spark.app, without_spark.app.plan.containers[C3])


def test_a_lost_container_goes_to_the_ready_spare_and_a_new_spare_is_launched():
    cluster = spared()
    checkpointed(cluster, SOURCE, 20, 40, 60)
    checkpointed(cluster, RELAY, 20, 40, 60)
    checkpointed(cluster, SINK, 20, 40)
    generation = cluster.ops[RELAY].generation

    [loss] = cluster.liveness({C1: -9})  # the relay's process exited: no timeout waited for
    assert (loss.container_id, loss.replacement_id) == (C1, C3)
    assert (cluster.killed, cluster.launched) == ([C1], [C4])  # C4: the new spare
    plan = cluster.app.plan
    took_over, new_spare = plan.containers[C3], plan.containers[C4]
    assert (took_over.spare, took_over.replaces, plan.containers[C1].replaced_by) == (
        False, C1, C3)
    assert new_spare.spare and new_spare.state == ContainerState.ALLOCATED
    relay, sink = cluster.ops[RELAY], cluster.ops[SINK]
    # the same recovery as onto a new container: checkpoints, generations, the cascade
    assert (relay.state, relay.container_id, relay.deploy_window_id, relay.generation) == (
        OperatorState.PENDING_DEPLOY, C3, 40, generation + 1)
    assert (sink.state, sink.deploy_window_id) == (OperatorState.PENDING_UNDEPLOY, 40)
    assert not cluster.beat(C3).deploy_request  # the sink's old instance must go first
    assert list(cluster.report(SINK).undeploy_request) == [SINK]
    cluster.beat(C2)  # the sink is gone from c2
    [deploy] = cluster.beat(C3).deploy_request  # the spare hears of its operator at once
    assert (deploy.id, deploy.checkpoint.window_id, deploy.generation) == (RELAY, 40,
                                                                            generation + 1)
    assert cluster.app.state == ApplicationState.RUNNING  # the new spare is not waited for
    assert application_info(cluster.app).containers_spare == 1


def test_without_a_ready_spare_a_new_container_replaces_the_lost_one():
    cluster = spared(spare_ready=False)  # its Spark still warming up
    [loss] = cluster.liveness({C1: -9})
    assert loss.replacement_id == C4 and cluster.launched == [C4]
    plan = cluster.app.plan
    assert not plan.containers[C4].spare and plan.containers[C3].spare
    assert cluster.ops[RELAY].container_id == C4


def test_a_lost_spare_only_gets_a_new_spare():
    cluster = spared()
    states = {op.id: (op.state, op.generation) for op in cluster.ops.values()}
    [loss] = cluster.liveness({C3: -9})
    assert (loss.container_id, loss.replacement_id) == (C3, "")
    assert (cluster.killed, cluster.launched) == ([C3], [C4])
    plan = cluster.app.plan
    assert plan.containers[C4].spare
    assert (plan.containers[C3].replaced_by, plan.containers[C4].replaces) == (C4, C3)
    assert {op.id: (op.state, op.generation) for op in cluster.ops.values()} == states
    assert application_info(cluster.app).containers_planned == 4  # the lost spare is not
    assert cluster.app.recoveries == 0 and cluster.app.state == ApplicationState.RUNNING


def test_spares_that_keep_failing_before_they_are_ready_are_given_up():
    cluster = spared(spare_ready=False)
    for lost in range(3, 3 + spares.SPARE_LOSSES_IN_A_ROW):
        cluster.liveness({f"app-0001-c{lost}": 1})
    last = f"app-0001-c{3 + spares.SPARE_LOSSES_IN_A_ROW - 1}"
    assert cluster.launched[-1] == last  # no spare launched after the last loss
    assert not [c for c in cluster.app.plan.live_containers() if c.spare]
    error = cluster.app.reported_errors[-1]
    assert error.source == "master" and "no more spares are launched" in error.message
    [loss] = cluster.liveness({C1: -9})  # recovery goes on as without spares
    assert loss.replacement_id == cluster.launched[-1]


def test_two_spares_take_over_one_loss_each_oldest_first():
    cluster = spared(count=2)
    [first] = cluster.liveness({C1: -9})
    assert first.replacement_id == C3 and cluster.launched == [C5]
    cluster.clock.advance(1000)
    [second] = cluster.liveness({C2: -9})
    assert second.replacement_id == C4


def test_the_end_of_the_application_stops_its_spares():
    cluster = spared()
    for op_id in (SOURCE, RELAY, SINK):
        cluster.report(op_id, state=SHUTDOWN)
    assert cluster.app.state == ApplicationState.FINISHED
    assert cluster.beat(C3).shutdown == ABORT  # the spare is told to stop
    [loss] = cluster.liveness({C3: 0})  # ... and its exit is recorded, no spare follows
    assert loss.container_id == C3 and cluster.launched == []
    assert cluster.app.plan.containers[C3].ended_with_app


def test_submit_launches_the_spares_and_a_killed_spare_is_replaced():
    launcher = RecordingLauncher()
    core = MasterCore(launcher, clock=ManualClock())
    app_id = core.submit(chain_descriptor(3, CONTAINERS=3, SPARE_CONTAINERS=1), {})
    assert launcher.launched == [f"{app_id}-c{i}" for i in range(4)]
    assert core.kill_container(f"{app_id}-c3") == ""
    assert launcher.killed == [f"{app_id}-c3"] and launcher.launched[-1] == f"{app_id}-c4"
    states = {c.id: c.state for c in core.list_containers(app_id)}
    # launched, not heartbeating yet
    assert (states[f"{app_id}-c3"], states[f"{app_id}-c4"]) == ("KILLED", "SPARE_STARTING")


def test_a_restarted_master_keeps_its_spares_and_launches_what_it_had_queued(tmp_path):
    clock = ManualClock()

    def started() -> MasterCore:
        return MasterCore(RecordingLauncher(), clock=clock,
                          journal=ApplicationJournal(str(tmp_path / "journal")))

    core = started()
    app_id = core.submit(chain_descriptor(3, CONTAINERS=3, SPARE_CONTAINERS=1,
                                          STATE_DIR=str(tmp_path / "state")), {})
    cid = [f"{app_id}-c{i}" for i in range(6)]
    for c in cid[:4]:
        core.heartbeat(container_heartbeat(c, port=7000 + int(c[-1])))
    app = core.application(app_id)
    # a master that died after journaling a new spare but before launching it
    app.plan.containers[cid[3]].spark_warm = True
    core.kill_container(cid[1])  # the relay goes to the spare c3; c4, the new spare, queued
    assert app.plan.containers[cid[3]].replaces == cid[1]
    core.journal.close()

    clock.advance(1000)
    again = started()
    assert again.restore() == 1
    restored = again.application(app_id)
    containers = restored.plan.containers
    assert [c.id for c in containers.values() if c.spare] == [cid[4]]
    assert not containers[cid[3]].spare and restored.plan.operators[RELAY].container_id == cid[3]
    assert containers[cid[4]].state == ContainerState.ALLOCATED  # it may have been launched
    clock.advance(2 * restored.heartbeat_timeout_ms + 1)  # it never calls in: lost, replaced
    for c in cid[:4]:
        if c != cid[1]:
            again.heartbeat(container_heartbeat(c, port=7000 + int(c[-1])))
    assert cid[4] in again.check_liveness()
    assert again.launcher.launched == [cid[5]] and containers[cid[5]].spare


def test_spare_containers_is_bounded_with_a_message_naming_the_fix():
    with pytest.raises(InvalidAttribute, match=r"SPARE_CONTAINERS.*set 0 \(none\) to 16"):
        Dag("x", SPARE_CONTAINERS=-1)
    with pytest.raises(PlanError, match=r"SPARE_CONTAINERS='17'.*set 0 \(none\) to 16"):
        build_physical_plan(chain_descriptor(3), {"SPARE_CONTAINERS": "17"}, "app-0001")
