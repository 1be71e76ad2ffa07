"""Static partitioning in the physical plan: expansion, placement, unifiers, parallel
partitions, the deploy info a partition gets, and the errors for what is not possible."""

from __future__ import annotations

import cloudpickle
import pytest

from tests.master.cluster import Cluster, checkpointed
from tests.master.fakes import ManualClock, chain_descriptor
from weir.master.application import Application
from weir.master.core import MasterCore
from weir.master.errors import NotFound
from weir.master.heartbeat import deploy_info
from weir.master.launcher import RecordingLauncher
from weir.master.physical_plan import OperatorState, PlanError
from weir.master.planner import build_physical_plan
from weir.operators import Dag
from weir.operators.library import FileSink, TextFileSource, Tokenize, WindowedCount
from weir.operators.library.transforms import WindowedCountUnifier
from weir.operators.partitioning import partition_keys
from weir.operators.ports import OutputPort
from weir.operators.testing import CollectSink, ListSource
from weir.operators.unifiers import ConcatUnifier
from weir.proto import plan_pb2


def wordcount(containers: int = 3, **count_attributes: object) -> Dag:
    dag = Dag("wc", CONTAINERS=containers)
    source = dag.add_operator("source", TextFileSource("/nonexistent"))
    tokenize = dag.add_operator("tokenize", Tokenize())
    count = dag.add_operator("count", WindowedCount(key="word"), **count_attributes)
    files = dag.add_operator("files", FileSink("/nonexistent"))
    dag.add_stream("lines", source.output, tokenize.input)
    dag.add_stream("words", tokenize.output, count.input)
    dag.add_stream("counts", count.output, files.input)
    return dag


def plan_of(dag: Dag, overrides: dict[str, str] | None = None):
    return build_physical_plan(dag.to_descriptor(), overrides or {}, "app")


def test_partitions_become_operators_spread_over_containers_with_a_unifier():
    plan = plan_of(wordcount(PARTITIONS=3, PARTITION_KEY="word"))
    names = [op.name for op in plan.operators.values()]
    assert names == ["source", "tokenize", "count#0", "count#1", "count#2", "count#unifier",
                     "files"]
    ops = {op.name: op for op in plan.operators.values()}
    partitions = [ops[f"count#{i}"] for i in range(3)]
    assert len({op.container_id for op in partitions}) == 3
    assert [(op.logical_name, op.partition_index, op.partition_count) for op in partitions] \
        == [("count", i, 3) for i in range(3)]
    mask, keys = partition_keys(3)
    for index, op in enumerate(partitions):
        [link] = op.inputs
        assert link.source_operator_id == ops["tokenize"].id
        assert (link.partition.column, link.partition.mask, set(link.partition.keys)) == (
            "word", mask, keys[index])
        assert op.attributes["PARTITIONS"] == 3
    unifier = ops["count#unifier"]
    assert unifier.type == plan_pb2.OPERATOR_TYPE_UNIFIER
    assert unifier.container_id == ops["files"].container_id
    assert [(link.port_name, link.source_operator_id, link.partition)
            for link in unifier.inputs] == [(f"input-{i}", op.id, None)
                                            for i, op in enumerate(partitions)]
    assert unifier.attributes["APPLICATION_WINDOW_COUNT"] == 1
    assert isinstance(cloudpickle.loads(unifier.payload), WindowedCountUnifier)
    [files_input] = ops["files"].inputs
    assert (files_input.source_operator_id, files_input.source_port_name) == (unifier.id,
                                                                            "output")
    # ids stay topological: every input comes from a smaller id
    assert all(link.source_operator_id < op.id for op in plan.operators.values()
               for link in op.inputs)
    assert sorted(i for c in plan.containers.values() for i in c.operator_ids) == \
        sorted(plan.operators)


def test_an_operator_without_its_own_unifier_gets_the_concatenating_one():
    dag = Dag("plain", CONTAINERS=2)
    source = dag.add_operator("source", ListSource([[{"k": 1}]]))
    middle = dag.add_operator("middle", CollectPass(), PARTITIONS=2, PARTITION_KEY="k")
    sink = dag.add_operator("sink", CollectSink())
    dag.add_stream("a", source.output, middle.input)
    dag.add_stream("b", middle.output, sink.input)
    plan = plan_of(dag)
    unifier = plan.operator_by_name("middle#unifier")
    assert isinstance(cloudpickle.loads(unifier.payload), ConcatUnifier)
    assert unifier.class_name == "weir.operators.unifiers.ConcatUnifier"


def test_parallel_partitions_read_their_upstream_partition_without_split_or_unifier():
    dag = wordcount(PARTITIONS=2, PARTITION_KEY="word")
    # a second partitioned stage: files follows count partition by partition
    dag.set_operator_attributes("files", PARALLEL_PARTITION=True)
    plan = plan_of(dag)
    ops = {op.name: op for op in plan.operators.values()}
    assert "count#unifier" not in ops
    for index in range(2):
        [link] = ops[f"files#{index}"].inputs
        assert link.source_operator_id == ops[f"count#{index}"].id
        assert link.partition is None
        assert ops[f"files#{index}"].attributes["PARTITIONS"] == 2


def test_a_partitioned_reader_of_partitions_gets_a_unifier_each_taking_its_share():
    dag = wordcount(PARTITIONS=2, PARTITION_KEY="word")
    dag.set_operator_attributes("files", PARTITIONS=3, PARTITION_KEY="word")
    plan = plan_of(dag)
    ops = {op.name: op for op in plan.operators.values()}
    for index in range(3):
        reader = ops[f"files#{index}"]
        [link] = reader.inputs
        unifier = plan.operators[link.source_operator_id]
        assert unifier.name == f"count#unifier@files#{index}.input"
        assert unifier.container_id == reader.container_id
        assert {link.partition.keys for link in unifier.inputs} == {
            tuple(sorted(partition_keys(3)[1][index]))}


def test_pinned_partitioned_operator_keeps_all_partitions_in_its_container():
    plan = plan_of(wordcount(PARTITIONS=2, PARTITION_KEY="word", CONTAINER=1))
    assert {plan.operator_by_name(f"count#{i}").container_id for i in range(2)} == {"app-c1"}


def test_more_partitions_than_containers_wrap_around():
    plan = plan_of(wordcount(containers=2, PARTITIONS=3, PARTITION_KEY="word"))
    containers = [plan.operator_by_name(f"count#{i}").container_id for i in range(3)]
    assert len(set(containers)) == 2


def test_partitions_by_override_and_unpartitioned_plans_are_unchanged():
    plan = plan_of(wordcount(), {"count.PARTITIONS": "2", "count.PARTITION_KEY": "word"})
    assert plan.operator_by_name("count#1") is not None
    plain = plan_of(wordcount())
    assert [op.name for op in plain.operators.values()] == ["source", "tokenize", "count",
                                                             "files"]
    assert all(link.partition is None for op in plain.operators.values() for link in op.inputs)


@pytest.mark.parametrize(("attributes", "message"), [
    ({"PARTITIONS": 3}, "no PARTITION_KEY"),
    ({"PARALLEL_PARTITION": True}, "not all partitioned alike"),
])
def test_partitioning_errors_say_what_to_do(attributes, message):
    with pytest.raises(PlanError, match=message):
        plan_of(wordcount(**attributes))


def test_parallel_partition_with_another_count_is_an_error():
    dag = wordcount(PARTITIONS=2, PARTITION_KEY="word")
    dag.set_operator_attributes("files", PARALLEL_PARTITION=True, PARTITIONS=3)
    with pytest.raises(PlanError, match="leave PARTITIONS out"):
        plan_of(dag)


def test_bad_boolean_attribute_is_rejected():
    with pytest.raises(ValueError, match="not true or false"):
        wordcount(PARALLEL_PARTITION="maybe")


class CollectPass(CollectSink):
    """A sink with an output too, for plans only."""

    output = OutputPort()


def test_deploy_info_carries_each_partitions_share_of_its_input():
    dag = wordcount(PARTITIONS=3, PARTITION_KEY="word").to_descriptor()
    plan = build_physical_plan(dag, {}, "app")
    app = Application("app", dag, plan, 1_700_000_000_000)
    for container in plan.containers.values():
        container.buffer_server_host, container.buffer_server_port = "127.0.0.1", 7000
    mask, keys = partition_keys(3)
    for index in range(3):
        [link] = deploy_info(app, plan.operator_by_name(f"count#{index}")).inputs
        assert (link.partition_key_column, link.partition_mask, set(link.partition_keys)) == (
            "word", mask, keys[index])
    unifier = deploy_info(app, plan.operator_by_name("count#unifier"))
    assert unifier.type == plan_pb2.OPERATOR_TYPE_UNIFIER
    assert [i.port_name for i in unifier.inputs] == ["input-0", "input-1", "input-2"]
    assert not any(i.partition_key_column for i in unifier.inputs)


def test_losing_one_partition_rewinds_it_and_what_reads_it_but_not_its_siblings():
    cluster = Cluster(chain_descriptor(3), 3, **{"relay1.PARTITIONS": "2",
                                                 "relay1.PARTITION_KEY": "x"})
    cluster.deploy_all()
    ops = {op.name: op for op in cluster.ops.values()}
    assert list(ops) == ["source", "relay1#0", "relay1#1", "relay1#unifier", "sink"]
    lost = ops["relay1#1"].container_id
    assert lost not in (ops["relay1#0"].container_id, ops["source"].container_id)
    for op in ops.values():
        checkpointed(cluster, op.id, 20, 40)
    assert cluster.app.committed_window_id == 40

    cluster.liveness({lost: -9})
    assert ops["relay1#1"].state == OperatorState.PENDING_DEPLOY
    assert ops["relay1#1"].deploy_window_id == 40
    assert {ops["relay1#unifier"].state, ops["sink"].state} == {OperatorState.PENDING_UNDEPLOY}
    assert ops["source"].state == ops["relay1#0"].state == OperatorState.ACTIVE
    assert ops["relay1#0"].failure_count == 0


def test_asking_for_a_partitioned_operator_by_its_logical_name_names_its_partitions():
    core = MasterCore(RecordingLauncher("127.0.0.1:1"), clock=ManualClock())
    app_id = core.submit(chain_descriptor(3, CONTAINERS=2), {"relay1.PARTITIONS": "2",
                                                             "relay1.PARTITION_KEY": "x"})
    assert core.operator_info(app_id, "relay1#1").logical_name == "relay1"
    with pytest.raises(NotFound, match=r"runs as partitions \['relay1#0', 'relay1#1'\]"):
        core.operator_info(app_id, "relay1")
    info = core.application_info(app_id)
    relay = next(op for op in info.logical_operators if op.name == "relay1")
    assert len(relay.partition_ids) == 2
