"""Repartitioning a running operator, stepped by hand: which operators are replaced, which
restart and from where, what the new partitions' containers are told, the undeploy that
comes first, a container lost in the middle, the journal, and the refusals."""

from __future__ import annotations

import pytest

from tests.master.cluster import Cluster, checkpointed
from tests.master.fakes import (
    ManualClock,
    chain_dag,
    chain_descriptor,
    container_heartbeat,
    operator_report,
    window,
)
from weir.master.core import MasterCore
from weir.master.errors import FailedPrecondition, InvalidArgument, NotFound
from weir.master.launcher import RecordingLauncher
from weir.master.persistence import ApplicationJournal
from weir.master.physical_plan import OperatorState
from weir.master.repartition import repartition
from weir.master.stats_listeners import operator_stats
from weir.master.views import application_info, container_info
from weir.operators.library import FileSink
from weir.operators.partitioning import partition_keys

pytestmark = pytest.mark.timeout(30)


def partitioned_chain(partitions: int = 2, containers: int = 3, **more: str) -> Cluster:
    """source -> relay1 (``partitions`` on key x) -> [unifier] -> sink, deployed, with every
    operator checkpointed at 20 and 40 (the source at 60 too): committed 40."""
    overrides = {"relay1.PARTITION_KEY": "x", **more}
    if partitions > 1:
        overrides["relay1.PARTITIONS"] = str(partitions)
    cluster = Cluster(chain_descriptor(3), containers, **overrides)
    cluster.deploy_all()
    for op in list(cluster.ops.values()):
        checkpointed(cluster, op.id, *((20, 40, 60) if op.name == "source" else (20, 40)))
    assert cluster.app.committed_window_id == 40
    return cluster


def by_name(cluster: Cluster) -> dict[str, object]:
    return {op.name: op for op in cluster.ops.values()}


def let_go(cluster: Cluster) -> None:
    """Every container heartbeats without the operators it was told to undeploy."""
    for cid in {op.container_id for op in cluster.app.plan.retired.values()} | {
            op.container_id for op in cluster.ops.values()
            if op.state == OperatorState.PENDING_UNDEPLOY}:
        cluster.beat(cid)


def test_two_to_four_partitions_replaces_them_and_the_unifier_and_restarts_the_reader():
    cluster = partitioned_chain(2)
    old = by_name(cluster)
    old_ids = [old["relay1#0"].id, old["relay1#1"].id]
    retired_ids = {*old_ids, old["relay1#unifier"].id}

    result = repartition(cluster.app, "relay1", 4, cluster.clock())

    assert result.new == ("relay1#0", "relay1#1", "relay1#2", "relay1#3")
    assert result.start_window_id == 40 and result.restarted == ("sink",)
    assert set(cluster.app.plan.retired) == retired_ids
    assert all(op.state == OperatorState.PENDING_UNDEPLOY
               for op in cluster.app.plan.retired.values())
    ops = by_name(cluster)
    assert ops["source"] is old["source"] and ops["source"].state == OperatorState.ACTIVE
    assert ops["sink"] is old["sink"] and ops["sink"].state == OperatorState.PENDING_UNDEPLOY
    assert ops["sink"].deploy_window_id == 40
    new = [ops[f"relay1#{i}"] for i in range(4)]
    assert min(op.id for op in new) > max(retired_ids)  # ids are never used again
    mask, keys = partition_keys(4)
    for index, op in enumerate(new):
        assert op.state == OperatorState.PENDING_DEPLOY and op.deploy_window_id == 40
        assert op.recovery_window_id == 40 and cluster.app.checkpoints[op.id].windows == [40]
        assert op.seed.from_ids == tuple(old_ids) and set(op.seed.retired_ids) == retired_ids
        assert (op.seed.share.mask, set(op.seed.share.keys)) == (mask, keys[index])
        assert op.inputs[0].source_operator_id == ops["source"].id
    assert len({op.container_id for op in new}) == 3  # spread over every container
    listed = {i for c in cluster.app.plan.containers.values()
              for i in container_info(cluster.app, c).operator_ids}
    assert not listed & retired_ids and {op.id for op in new} <= listed  # weir containers
    unifier = ops["relay1#unifier"]
    assert unifier.id not in retired_ids
    assert [link.source_operator_id for link in unifier.inputs] == [op.id for op in new]
    assert unifier.seed.from_ids == () and unifier.seed.window_id == 40
    assert ops["sink"].inputs[0].source_operator_id == unifier.id
    # nothing can be committed past where the new partitions start
    assert cluster.app.committed_window_id == 40
    assert cluster.app.plan.topological_ids().index(unifier.id) < \
        cluster.app.plan.topological_ids().index(ops["sink"].id)


def test_new_partitions_deploy_only_after_the_old_ones_are_gone_with_their_seed():
    cluster = partitioned_chain(2)
    old_ids = {op.id for op in cluster.ops.values() if op.logical_name == "relay1"}
    repartition(cluster.app, "relay1", 4, cluster.clock())
    first = by_name(cluster)["relay1#0"]
    # the old partitions still run: a heartbeat reporting one gets its undeploy, and no
    # container gets a deploy while any old one runs
    old = cluster.app.plan.retired[min(old_ids)]
    response = cluster.beat(old.container_id, operator_report(old.id))
    assert list(response.undeploy_request) == [old.id] and not response.deploy_request
    assert not cluster.beat(first.container_id).deploy_request
    assert old.state == OperatorState.PENDING_UNDEPLOY
    let_go(cluster)
    assert all(op.state == OperatorState.SHUTDOWN for op in cluster.app.plan.retired.values())
    response = cluster.beat(first.container_id)
    infos = {info.name: info for info in response.deploy_request}
    info = infos["relay1#0"]
    assert info.checkpoint.window_id == info.seed.window_id == 40
    assert sorted(info.seed.from_node_ids) == sorted(old_ids)
    assert info.seed.key_column == "x" and info.seed.mask == partition_keys(4)[0]
    assert set(info.seed.keys) == partition_keys(4)[1][0]
    assert info.inputs[0].partition_key_column == "x"
    assert set(info.inputs[0].partition_keys) == partition_keys(4)[1][0]

    # deployed and checkpointed past the start: commits move
    ops = by_name(cluster)
    for op in ops.values():
        if op.state == OperatorState.PENDING_DEPLOY:
            cluster.report(op.id)
    assert all(op.state == OperatorState.ACTIVE for op in ops.values())
    for op in ops.values():
        checkpointed(cluster, op.id, 60)
    assert cluster.app.committed_window_id == 60


def test_a_container_lost_during_the_repartition_takes_its_retired_operators_with_it():
    cluster = partitioned_chain(2)
    repartition(cluster.app, "relay1", 4, cluster.clock())
    retired = next(op for op in cluster.app.plan.retired.values()
                   if op.name == "relay1#1")
    lost = retired.container_id
    new_there = [op for op in cluster.ops.values() if op.container_id == lost]
    cluster.liveness({lost: -9})
    assert retired.state == OperatorState.SHUTDOWN
    replacement = cluster.app.plan.containers[lost].replaced_by
    for op in new_there:
        assert op.container_id == replacement
        assert op.state == OperatorState.PENDING_DEPLOY
        if op.seed is not None:  # still made from the old partitions' checkpoints
            assert op.deploy_window_id == op.seed.window_id == 40


def test_one_to_two_and_back_adds_then_removes_the_unifier():
    cluster = partitioned_chain(1)
    assert repartition(cluster.app, "relay1", 2, cluster.clock()).new == (
        "relay1#0", "relay1#1")
    ops = by_name(cluster)
    assert "relay1#unifier" in ops and ops["relay1#0"].seed.from_ids == (2,)
    let_go(cluster)
    for op in list(cluster.ops.values()):
        if op.state == OperatorState.PENDING_DEPLOY:
            cluster.beat(op.container_id)
            cluster.report(op.id)
    for op in list(cluster.ops.values()):
        checkpointed(cluster, op.id, 60, 80)
    assert cluster.app.committed_window_id == 80

    result = repartition(cluster.app, "relay1", 1, cluster.clock())
    ops = by_name(cluster)
    assert result.new == ("relay1",) and result.start_window_id == 80
    assert "relay1#unifier" not in ops
    assert ops["relay1"].seed.share is None  # it takes every key of both old partitions
    assert len(ops["relay1"].seed.from_ids) == 2
    assert ops["sink"].inputs[0].source_operator_id == ops["relay1"].id


def test_the_journal_keeps_the_new_plan_and_the_retired_operators(tmp_path):
    cluster = partitioned_chain(2)
    journal = ApplicationJournal(str(tmp_path / "journal"))
    journal.save(cluster.app, None)
    repartition(cluster.app, "relay1", 3, cluster.clock())
    journal.save(cluster.app, None)
    journal.close()

    [(app, _)] = ApplicationJournal(str(tmp_path / "journal")).load()
    assert {op.name: op.id for op in app.plan.operators.values()} == \
        {op.name: op.id for op in cluster.ops.values()}
    assert set(app.plan.retired) == set(cluster.app.plan.retired)
    restored = {op.name: op for op in app.plan.operators.values()}
    assert restored["relay1#2"].seed == by_name(cluster)["relay1#2"].seed
    assert restored["sink"].inputs == by_name(cluster)["sink"].inputs
    assert app.repartitions == 1 and "2 -> 3 partitions" in app.last_repartition


def test_refusals_name_the_reason():
    cluster = partitioned_chain(2)
    with pytest.raises(NotFound, match="no operator 'nope'.*'relay1'"):
        repartition(cluster.app, "nope", 2, cluster.clock())
    with pytest.raises(FailedPrecondition, match="'source' is a source"):
        repartition(cluster.app, "source", 2, cluster.clock())
    with pytest.raises(FailedPrecondition, match="already has 2 partition"):
        repartition(cluster.app, "relay1", 2, cluster.clock())
    with pytest.raises(InvalidArgument, match="1 to 256"):
        repartition(cluster.app, "relay1", 0, cluster.clock())
    with pytest.raises(InvalidArgument, match="no PARTITION_KEY.*-D sink.PARTITION_KEY"):
        repartition(cluster.app, "sink", 2, cluster.clock())
    repartition(cluster.app, "relay1", 3, cluster.clock())
    with pytest.raises(FailedPrecondition, match="being \\(re\\)deployed"):
        repartition(cluster.app, "relay1", 4, cluster.clock())


def test_a_repartition_past_max_operators_is_refused():
    cluster = partitioned_chain(2, MAX_OPERATORS="5")  # source, 2 partitions, unifier, sink
    with pytest.raises(InvalidArgument, match="6 physical operators.*MAX_OPERATORS=5"):
        repartition(cluster.app, "relay1", 3, cluster.clock())
    assert len(cluster.app.plan.instances("relay1")) == 2
    repartition(cluster.app, "relay1", 1, cluster.clock())  # fewer: allowed


def test_an_operator_whose_state_cannot_move_is_refused():
    dag = chain_dag(2)
    dag.add_operator("files", FileSink("/nonexistent", exactly_once=True),
                     PARTITION_KEY="x")
    dag.add_stream("to_files", dag._operators["source"].output,
                   dag._operators["files"].input)
    cluster = Cluster(dag.to_descriptor(), 2)
    cluster.deploy_all()
    with pytest.raises(FailedPrecondition, match="commit steps"):
        repartition(cluster.app, "files", 2, cluster.clock())


# -- stats listeners: the master feeds them and applies what they ask ------------------------
SEEN: list = []  # what AskFor listeners were given (the master runs its own copy)


class AskFor:
    """A listener asking for ``count`` partitions (a str: raising it), noting what it saw."""

    def __init__(self, count: int | str) -> None:
        self.count = count

    def process_stats(self, stats):
        SEEN.append(stats)
        if isinstance(self.count, str):
            raise RuntimeError(self.count)
        return self.count


def running_core(listener, journal: ApplicationJournal | None = None
                 ) -> tuple[MasterCore, str]:
    """A master core with the chain (relay1 keyed on x, with ``listener``), every operator
    deployed and ACTIVE through hand-made heartbeats."""
    dag = chain_dag(3, CONTAINERS=3)
    dag._stats_listeners["relay1"] = listener
    core = MasterCore(RecordingLauncher("127.0.0.1:1"), clock=ManualClock(), journal=journal)
    app_id = core.submit(dag.to_descriptor(), {"relay1.PARTITION_KEY": "x"})
    containers = [c.id for c in core.list_containers(app_id)]
    for index, cid in enumerate(containers):
        core.heartbeat(container_heartbeat(cid, port=7000 + index))
    for index, cid in enumerate(containers):
        deployed = core.heartbeat(container_heartbeat(cid, port=7000 + index)).deploy_request
        core.heartbeat(container_heartbeat(cid, port=7000 + index, operators=[
            operator_report(info.id) for info in deployed]))
    assert core.application_info(app_id).state == "RUNNING"
    return core, app_id


def test_a_stats_listener_asking_for_partitions_gets_a_repartition():
    SEEN.clear()
    core, app_id = running_core(AskFor(2))
    [done] = core.consult_listeners()
    assert done.new == ("relay1#0", "relay1#1")
    stats = core_listener_stats(core, app_id, "relay1")
    assert [p.name for p in stats.partitions] == ["relay1#0", "relay1#1"]
    [seen] = SEEN
    assert seen.operator == "relay1" and [p.name for p in seen.partitions] == ["relay1"]
    info = core.application_info(app_id)
    assert info.repartitions == 1 and "stats listener AskFor" in info.last_repartition
    # while the new partitions deploy the application is not healthy: no listener runs
    assert core.consult_listeners() == [] and len(SEEN) == 1


def test_a_failing_stats_listener_is_recorded_and_the_application_goes_on():
    core, app_id = running_core(AskFor("no figures today"))
    assert core.consult_listeners() == []
    info = core.application_info(app_id)
    assert info.state == "RUNNING" and info.repartitions == 0
    assert any("stats listener of 'relay1': RuntimeError: no figures today" in f.message
               for f in info.recent_failures)


def test_a_stats_listener_the_master_cannot_load_fails_the_submit():
    dag = chain_dag(3)
    descriptor = dag.to_descriptor()
    descriptor.operators[1].stats_listener_payload = b"not a pickle"
    descriptor.operators[1].stats_listener_class_name = "app.Gone"
    core = MasterCore(RecordingLauncher("127.0.0.1:1"), clock=ManualClock())
    with pytest.raises(InvalidArgument, match="stats listener of operator 'relay1' "
                                              r"\(app.Gone\) cannot be loaded in the master"):
        core.submit(descriptor, {})


def core_listener_stats(core: MasterCore, app_id: str, operator: str):
    with core.lock:
        app = core.application(app_id)
        return operator_stats(app, operator, 0)


def test_a_master_restarted_after_a_repartition_goes_on_with_the_new_plan(tmp_path):
    SEEN.clear()
    core, app_id = running_core(AskFor(2), ApplicationJournal(str(tmp_path / "journal")))
    core.repartition(app_id, "relay1", 2)
    with core.lock:
        retired = dict(core.application(app_id).plan.retired)
    core.journal.close()

    again = MasterCore(RecordingLauncher("127.0.0.1:1"), clock=ManualClock(),
                       journal=ApplicationJournal(str(tmp_path / "journal")))
    assert again.restore() == 1
    names = [op.name for op in again.list_operators(app_id)]
    assert names == ["source", "sink", "relay1#0", "relay1#1", "relay1#unifier"]
    [old] = retired.values()
    index = int(old.container_id.rsplit("c", 1)[1])
    response = again.heartbeat(container_heartbeat(old.container_id, port=7000 + index,
                                                   operators=[operator_report(old.id)]))
    assert list(response.undeploy_request) == [old.id]  # the old instance is still told to go
    again.heartbeat(container_heartbeat(old.container_id, port=7000 + index))
    with again.lock:
        assert again.application(app_id).plan.retired[old.id].state == OperatorState.SHUTDOWN
    assert again.consult_listeners() == []  # new partitions not deployed yet: no listener runs


def deploy_pending(cluster: Cluster) -> None:
    """The old instances go, then every pending operator is deployed and reports ACTIVE."""
    let_go(cluster)
    for op in list(cluster.ops.values()):
        if op.state == OperatorState.PENDING_DEPLOY:
            cluster.beat(op.container_id)
            cluster.report(op.id)
    assert all(op.state == OperatorState.ACTIVE for op in cluster.ops.values())


def test_a_reader_of_a_partitioned_upstream_gets_new_unifiers_each_taking_its_share():
    cluster = Cluster(chain_descriptor(4), 3, **{
        "relay1.PARTITIONS": "2", "relay1.PARTITION_KEY": "x",
        "relay2.PARTITIONS": "2", "relay2.PARTITION_KEY": "x"})
    cluster.deploy_all()
    for op in list(cluster.ops.values()):
        checkpointed(cluster, op.id, 20, 40)
    before = by_name(cluster)
    upstream = {before["relay1#0"].id, before["relay1#1"].id}

    result = repartition(cluster.app, "relay2", 3, cluster.clock())
    ops = by_name(cluster)
    assert result.start_window_id == 40 and result.restarted == ("sink",)
    assert {op.name for op in cluster.app.plan.retired.values()} == {
        "relay2#0", "relay2#1", "relay2#unifier", "relay1#unifier@relay2#0.input",
        "relay1#unifier@relay2#1.input"}
    assert ops["relay1#0"] is before["relay1#0"]  # the upstream is not touched
    assert ops["relay1#0"].state == OperatorState.ACTIVE
    mask, keys = partition_keys(3)
    for index in range(3):
        partition = ops[f"relay2#{index}"]
        assert (partition.seed.share.mask, set(partition.seed.share.keys)) == (mask,
                                                                               keys[index])
        [link] = partition.inputs
        unifier = cluster.app.plan.operators[link.source_operator_id]
        assert unifier.name == f"relay1#unifier@relay2#{index}.input"
        assert unifier.state == OperatorState.PENDING_DEPLOY
        assert unifier.deploy_window_id == 40 and unifier.seed.from_ids == ()
        assert {link.source_operator_id for link in unifier.inputs} == upstream
        assert {(link.partition.mask, frozenset(link.partition.keys))
                for link in unifier.inputs} == {(mask, keys[index])}
    # the upstream's windows after the start stay replayable
    assert all(cluster.ops[i].recovery_window_id <= 40 for i in upstream)

    deploy_pending(cluster)
    for op in list(cluster.ops.values()):
        checkpointed(cluster, op.id, 60)
    result = repartition(cluster.app, "relay2", 1, cluster.clock())
    ops = by_name(cluster)
    assert result.new == ("relay2",) and result.start_window_id == 60
    assert ops["relay2"].seed.share is None and len(ops["relay2"].seed.from_ids) == 3
    [link] = ops["relay2"].inputs
    assert cluster.app.plan.operators[link.source_operator_id].name == "relay1#unifier"
    assert not [op.name for op in ops.values() if "@" in op.name]
    # the first repartition's retired operators are still listed for deletion
    assert {op.id for op in before.values() if op.logical_name == "relay2"} <= set(
        ops["relay2"].seed.retired_ids)


def test_at_most_once_operators_are_refused():
    cluster = Cluster(chain_descriptor(3), 3, **{"relay1.PARTITION_KEY": "x",
                                                 "relay1.PROCESSING_MODE": "AT_MOST_ONCE",
                                                 "sink.PROCESSING_MODE": "AT_MOST_ONCE"})
    cluster.deploy_all()
    with pytest.raises(FailedPrecondition, match="AT_MOST_ONCE: new partitions would skip"):
        repartition(cluster.app, "relay1", 2, cluster.clock())


def test_totals_keep_what_the_retired_partitions_did():
    cluster = partitioned_chain(2)
    with_inputs = 0
    for op in list(cluster.ops.values()):  # each reports on the ports it has
        in_port = op.inputs[0].port_name if op.inputs else None
        out_port = op.outputs[0].port_name if op.outputs else None
        with_inputs += in_port is not None
        cluster.report(op.id, window(80, tuples_in=100, tuples_out=50, in_port=in_port,
                                     out_port=out_port))
    before = application_info(cluster.app)
    repartition(cluster.app, "relay1", 3, cluster.clock())
    after = application_info(cluster.app)
    assert before.total_tuples_processed == after.total_tuples_processed == 100 * with_inputs
    logical = {op.name: op for op in after.logical_operators}
    assert logical["relay1"].total_tuples_processed == 200
    assert len(logical["relay1"].partition_ids) == 3


def test_new_partitions_of_a_pinned_operator_stay_in_its_container():
    cluster = Cluster(chain_descriptor(3), 3, **{"relay1.PARTITION_KEY": "x",
                                                 "relay1.CONTAINER": "1"})
    cluster.deploy_all()
    pinned = by_name(cluster)["relay1"].container_id
    repartition(cluster.app, "relay1", 3, cluster.clock())
    assert {by_name(cluster)[f"relay1#{i}"].container_id for i in range(3)} == {pinned}
