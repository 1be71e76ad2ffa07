"""Physical plan: ids, types, placement over containers, attribute resolution and errors."""

from __future__ import annotations

import os
import tempfile

import pytest

from tests.master.fakes import Relay, Sink, Source, chain_dag, chain_descriptor
from weir.master.errors import InvalidTransition
from weir.master.physical_plan import ContainerState, OperatorState, PlanError
from weir.master.plan_attributes import resolve_attributes
from weir.master.planner import build_physical_plan, place_operators
from weir.operators import Dag
from weir.proto import plan_pb2

pytestmark = pytest.mark.timeout(30)


def test_ids_follow_topological_order_and_types():
    plan = build_physical_plan(chain_descriptor(4), {}, "app-0001")
    assert [(op.id, op.name) for op in plan.operators.values()] == [
        (1, "source"), (2, "relay1"), (3, "relay2"), (4, "sink")]
    assert plan.operators[1].type == plan_pb2.OPERATOR_TYPE_INPUT
    assert {plan.operators[i].type for i in (2, 3, 4)} == {plan_pb2.OPERATOR_TYPE_GENERIC}
    assert all(op.state == OperatorState.PENDING_DEPLOY for op in plan.operators.values())
    assert plan.operators[1].payload  # the pickled instance travels to the container


def test_streams_become_input_and_output_links():
    plan = build_physical_plan(chain_descriptor(3), {}, "app-0001")
    relay = plan.operator_by_name("relay1")
    [link] = relay.inputs
    assert (link.port_name, link.source_operator_id, link.source_port_name) == (
        "input", 1, "output")
    assert [o.port_name for o in plan.operators[1].outputs] == ["output"]
    assert plan.operator_by_name("sink").outputs == []
    assert plan.upstream_ids(3) == [2]


def test_default_two_containers_contiguous_and_even():
    plan = build_physical_plan(chain_descriptor(3), {}, "app-0007")
    assert list(plan.containers) == ["app-0007-c0", "app-0007-c1"]
    assert plan.containers["app-0007-c0"].operator_ids == [1, 2]
    assert plan.containers["app-0007-c1"].operator_ids == [3]
    assert all(c.state == ContainerState.NEW for c in plan.containers.values())


@pytest.mark.parametrize(("ops", "containers", "sizes"), [
    (5, 2, [3, 2]), (5, 3, [2, 2, 1]), (2, 4, [1, 1]), (6, 3, [2, 2, 2]), (2, 1, [2]),
])
def test_containers_are_as_even_as_possible(ops, containers, sizes):
    plan = build_physical_plan(chain_descriptor(ops), {"CONTAINERS": str(containers)}, "a")
    assert [len(c.operator_ids) for c in plan.containers.values()] == sizes
    placed = [i for c in plan.containers.values() for i in c.operator_ids]
    assert placed == sorted(placed)  # contiguous chunks in topological order


def test_one_operator_needs_one_container():
    dag = Dag("single")
    dag.add_operator("source", Source())
    plan = build_physical_plan(dag.to_descriptor(), {}, "app")
    assert list(plan.containers) == ["app-c0"]


def test_pinned_operator_goes_to_its_container_and_others_fill_around():
    placement = place_operators(["a", "b", "c", "d"], {"a": 1}, 2)
    assert placement == {"a": 1, "b": 0, "c": 0, "d": 1}
    dag = chain_dag(4)
    dag.set_operator_attributes("sink", CONTAINER=0)
    plan = build_physical_plan(dag.to_descriptor(), {}, "app")
    assert plan.operator_by_name("sink").container_id == "app-c0"
    assert [len(c.operator_ids) for c in plan.containers.values()] == [2, 2]


def test_pin_beyond_containers_is_an_error():
    with pytest.raises(PlanError, match="CONTAINER=2 but the application has CONTAINERS=2"):
        build_physical_plan(chain_descriptor(3), {"sink.CONTAINER": "2"}, "app")


def test_attribute_layers_defaults_dag_plain_operator_qualified():
    dag = Dag("layers", STREAMING_WINDOW_SIZE_MILLIS=250, CHECKPOINT_WINDOW_COUNT=5)
    src = dag.add_operator("source", Source(), APPLICATION_WINDOW_COUNT=4,
                           CHECKPOINT_WINDOW_COUNT=8)
    relay = dag.add_operator("relay", Relay())
    sink = dag.add_operator("sink", Sink(), CHECKPOINT_WINDOW_COUNT=7)
    dag.add_stream("a", src.output, relay.input)
    dag.add_stream("b", relay.output, sink.input)
    overrides = {"CHECKPOINT_WINDOW_COUNT": "9", "APPLICATION_WINDOW_COUNT": "2",
                 "relay.APPLICATION_WINDOW_COUNT": "3", "sink.CHECKPOINT_WINDOW_COUNT": "12"}
    dag_attrs, op_attrs = resolve_attributes(dag.to_descriptor(), overrides)
    assert dag_attrs["STREAMING_WINDOW_SIZE_MILLIS"] == 250  # DAG over default
    assert dag_attrs["CHECKPOINT_WINDOW_COUNT"] == 9  # override over DAG
    assert dag_attrs["HEARTBEAT_TIMEOUT_MILLIS"] == 10_000  # default
    assert "APPLICATION_WINDOW_COUNT" not in dag_attrs  # operator-only attribute
    assert op_attrs["source"]["APPLICATION_WINDOW_COUNT"] == 4  # own over plain override
    assert op_attrs["relay"]["APPLICATION_WINDOW_COUNT"] == 3  # qualified override wins
    assert op_attrs["sink"]["APPLICATION_WINDOW_COUNT"] == 2  # plain override over default
    assert op_attrs["sink"]["CHECKPOINT_WINDOW_COUNT"] == 12
    assert op_attrs["source"]["CHECKPOINT_WINDOW_COUNT"] == 8  # own over plain override
    assert op_attrs["relay"]["CHECKPOINT_WINDOW_COUNT"] == 9
    assert op_attrs["relay"]["STREAMING_WINDOW_SIZE_MILLIS"] == 250  # DAG reaches operators
    plan = build_physical_plan(dag.to_descriptor(), overrides, "app")
    assert plan.operator_by_name("relay").attribute_text()["APPLICATION_WINDOW_COUNT"] == "3"


@pytest.mark.parametrize(("overrides", "message"), [
    ({"NO_SUCH_THING": "1"}, "unknown attribute 'NO_SUCH_THING'"),
    ({"sink.NO_SUCH_THING": "1"}, "unknown attribute 'NO_SUCH_THING'"),
    ({"ghost.APPLICATION_WINDOW_COUNT": "2"}, "unknown operator 'ghost'"),
    ({"CONTAINERS": "many"}, "CONTAINERS='many' is invalid"),
    ({"sink.CONTAINERS": "2"}, "cannot be set on an operator"),
    ({"CONTAINERS": "3000000"}, "CONTAINERS='3000000' is invalid: 3000000 is more than 1024"),
    ({"sink.PARTITIONS": "5000"}, "PARTITIONS='5000' is invalid: 5000 is more than 1024"),
])
def test_bad_overrides_raise_clear_errors(overrides, message):
    with pytest.raises(PlanError, match=message):
        build_physical_plan(chain_descriptor(3), overrides, "app")


def test_illegal_transitions_name_both_states():
    plan = build_physical_plan(chain_descriptor(3), {}, "app")
    container = plan.containers["app-c0"]
    with pytest.raises(InvalidTransition, match="container app-c0: illegal transition "
                                                "NEW -> ACTIVE"):
        container.transition(ContainerState.ACTIVE)
    op = plan.operators[1]
    op.transition(OperatorState.SHUTDOWN)
    with pytest.raises(InvalidTransition, match="SHUTDOWN -> ACTIVE"):
        op.transition(OperatorState.ACTIVE)
    assert op.transition(OperatorState.SHUTDOWN) is False  # same state: no transition


def test_recovery_transitions():
    plan = build_physical_plan(chain_descriptor(3), {}, "app-0001")
    op = plan.operators[2]
    op.transition(OperatorState.ACTIVE)
    assert op.transition(OperatorState.PENDING_UNDEPLOY) and op.pending
    assert op.transition(OperatorState.PENDING_DEPLOY) and op.pending
    op.transition(OperatorState.SHUTDOWN)
    assert op.transition(OperatorState.PENDING_DEPLOY)  # an ended operator may rerun
    with pytest.raises(InvalidTransition, match="PENDING_UNDEPLOY -> ACTIVE"):
        op.state = OperatorState.PENDING_UNDEPLOY
        op.transition(OperatorState.ACTIVE)


def test_downstream_and_next_container():
    plan = build_physical_plan(chain_descriptor(3), {"CONTAINERS": "3"}, "app-0001")
    assert [plan.downstream_ids(i) for i in (1, 2, 3)] == [[2], [3], []]
    assert plan.next_container_index() == 3
    c1 = plan.containers["app-0001-c1"]
    plan.operators[2].container_id = "app-0001-c3"  # as recovery moves it
    assert plan.operators_in(c1) == [] and c1.operator_ids == [2]


def test_state_dir_is_resolved_per_application_run_when_empty(tmp_path):
    plan = build_physical_plan(chain_descriptor(3), {}, "app-0007", "20261123T100000-abcdef")
    expected = os.path.join(tempfile.gettempdir(), f"weir-state-{os.getuid()}",
                            "app-0007-20261123T100000-abcdef")
    assert plan.attributes["STATE_DIR"] == expected
    other_run = build_physical_plan(chain_descriptor(3), {}, "app-0007")
    assert other_run.attributes["STATE_DIR"] != expected  # another master's app-0007
    assert all(op.attributes["STATE_DIR"] == expected for op in plan.operators.values())
    plan = build_physical_plan(chain_descriptor(3), {"STATE_DIR": str(tmp_path)}, "app-0008")
    assert plan.attributes["STATE_DIR"] == str(tmp_path)
    assert plan.operators[3].attribute_text()["STATE_DIR"] == str(tmp_path)


def test_a_checkpoint_count_must_be_a_multiple_of_the_application_window_count():
    with pytest.raises(PlanError, match=r"operator 'relay1' has CHECKPOINT_WINDOW_COUNT=5, not a "
                                        r"multiple of its APPLICATION_WINDOW_COUNT=2.*"
                                        r"-D relay1.CHECKPOINT_WINDOW_COUNT=6"):
        build_physical_plan(chain_descriptor(3), {"CHECKPOINT_WINDOW_COUNT": "5",
                                                  "relay1.APPLICATION_WINDOW_COUNT": "2"}, "a")
    plan = build_physical_plan(chain_descriptor(3), {"CHECKPOINT_WINDOW_COUNT": "6",
                                                     "relay1.APPLICATION_WINDOW_COUNT": "2"}, "a")
    assert plan.operator_by_name("relay1").attributes["CHECKPOINT_WINDOW_COUNT"] == 6


def test_exactly_once_checkpoints_every_application_window():
    with pytest.raises(PlanError, match=r"'relay1' has PROCESSING_MODE=EXACTLY_ONCE but "
                                        r"CHECKPOINT_WINDOW_COUNT=4.*"
                                        r"relay1.CHECKPOINT_WINDOW_COUNT=2 \(its APPLICATION"):
        build_physical_plan(chain_descriptor(3), {
            "PROCESSING_MODE": "EXACTLY_ONCE", "CHECKPOINT_WINDOW_COUNT": "1",
            "relay1.APPLICATION_WINDOW_COUNT": "2", "relay1.CHECKPOINT_WINDOW_COUNT": "4"}, "a")
    plan = build_physical_plan(chain_descriptor(3), {
        "PROCESSING_MODE": "EXACTLY_ONCE", "CHECKPOINT_WINDOW_COUNT": "1",
        "relay1.APPLICATION_WINDOW_COUNT": "2", "relay1.CHECKPOINT_WINDOW_COUNT": "2"}, "a")
    assert plan.operator_by_name("relay1").processing_mode == "EXACTLY_ONCE"


def test_an_operator_reading_an_at_most_once_operator_must_be_at_most_once():
    with pytest.raises(PlanError, match=r"operator 'sink' \(AT_LEAST_ONCE\) reads stream .* of "
                                        r"AT_MOST_ONCE operator 'relay1'.*"
                                        r"-D sink.PROCESSING_MODE=AT_MOST_ONCE"):
        build_physical_plan(chain_descriptor(3), {"relay1.PROCESSING_MODE": "AT_MOST_ONCE"}, "a")
    plan = build_physical_plan(chain_descriptor(3), {"relay1.PROCESSING_MODE": "AT_MOST_ONCE",
                                                     "sink.PROCESSING_MODE": "AT_MOST_ONCE"},
                               "a")
    assert [op.processing_mode for op in plan.operators.values()] == [
        "AT_LEAST_ONCE", "AT_MOST_ONCE", "AT_MOST_ONCE"]


def test_exactly_once_needs_a_checkpoint_every_window():
    with pytest.raises(PlanError, match=r"operator 'source' has PROCESSING_MODE=EXACTLY_ONCE "
                                        r"but CHECKPOINT_WINDOW_COUNT=20"):
        build_physical_plan(chain_descriptor(3), {"PROCESSING_MODE": "EXACTLY_ONCE"}, "a")
    plan = build_physical_plan(chain_descriptor(3), {"PROCESSING_MODE": "EXACTLY_ONCE",
                                                     "CHECKPOINT_WINDOW_COUNT": "1"}, "a")
    assert plan.operators[2].processing_mode == "EXACTLY_ONCE"
    plan = build_physical_plan(chain_descriptor(3), {"sink.PROCESSING_MODE": "AT_MOST_ONCE"},
                               "a")  # a sink may be AT_MOST_ONCE after AT_LEAST_ONCE operators
    assert [op.processing_mode for op in plan.operators.values()] == [
        "AT_LEAST_ONCE", "AT_LEAST_ONCE", "AT_MOST_ONCE"]
