"""Heartbeat and liveness rules, stepped by hand: hand-built heartbeats and a manual clock."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tests.master.cluster import Cluster
from tests.master.fakes import (
    ManualClock,
    chain_descriptor,
    container_heartbeat,
    operator_report,
    window,
)
from weir.master.application import Application, ApplicationState
from weir.master.heartbeat import process_heartbeat
from weir.master.liveness import check_liveness
from weir.master.physical_plan import ContainerState, OperatorState
from weir.master.planner import build_physical_plan
from weir.proto import plan_pb2, umbilical_pb2

pytestmark = pytest.mark.timeout(30)

ABORT = umbilical_pb2.SHUTDOWN_TYPE_ABORT
WAIT = umbilical_pb2.SHUTDOWN_TYPE_WAIT_TERMINATE
ACTIVE = umbilical_pb2.OPERATOR_STATE_ACTIVE
SHUTDOWN = umbilical_pb2.OPERATOR_STATE_SHUTDOWN
FAILED = umbilical_pb2.OPERATOR_STATE_FAILED


def make_app(clock: ManualClock, n: int = 3, containers: int = 3, **overrides: str
             ) -> Application:
    """An application whose containers were just launched (ALLOCATED), window ids plain
    counters: the shared fake cluster's, with the test playing each heartbeat itself."""
    return Cluster(chain_descriptor(n), containers, clock=clock, **overrides).app


def activate_all(app: Application, clock: ManualClock) -> dict[str, umbilical_pb2.
                                                                ContainerHeartbeatResponse]:
    """First heartbeat of every container, in order; returns the last answer of each."""
    answers = {}
    for i, cid in enumerate(app.plan.containers):
        answers[cid] = process_heartbeat(app, container_heartbeat(cid, port=7000 + i), clock())
    return answers


def test_unknown_container_gets_abort():
    clock = ManualClock()
    app = make_app(clock)
    assert process_heartbeat(None, container_heartbeat("nobody"), clock()).shutdown == ABORT
    assert process_heartbeat(app, container_heartbeat("app-0001-c9"), clock()).shutdown == ABORT


def test_first_heartbeat_makes_container_active_and_records_buffer_server():
    clock = ManualClock()
    app = make_app(clock)
    response = process_heartbeat(app, container_heartbeat("app-0001-c0", port=7100), clock())
    container = app.plan.containers["app-0001-c0"]
    assert container.state == ContainerState.ACTIVE
    assert container.buffer_server_address == "127.0.0.1:7100"
    assert app.container_stats["app-0001-c0"].process_name == "7100@testhost"
    assert app.container_stats["app-0001-c0"].heartbeats == 1
    assert response.shutdown == umbilical_pb2.SHUTDOWN_TYPE_NONE
    assert response.committed_window_id == -1
    assert not response.deploy_request  # the other containers are not ACTIVE yet
    assert response.has_pending_requests
    assert app.state == ApplicationState.ACCEPTED


def test_no_deploy_until_every_container_is_active():
    clock = ManualClock()
    app = make_app(clock)
    process_heartbeat(app, container_heartbeat("app-0001-c0", port=7000), clock())
    process_heartbeat(app, container_heartbeat("app-0001-c1", port=7001), clock())
    again = process_heartbeat(app, container_heartbeat("app-0001-c0", port=7000), clock())
    assert not again.deploy_request
    last = process_heartbeat(app, container_heartbeat("app-0001-c2", port=7002), clock())
    assert app.state == ApplicationState.RUNNING
    [sink] = last.deploy_request
    assert (sink.id, sink.name, sink.type) == (3, "sink", plan_pb2.OPERATOR_TYPE_GENERIC)
    [first] = process_heartbeat(app, container_heartbeat("app-0001-c0"), clock()).deploy_request
    assert (first.id, first.type) == (1, plan_pb2.OPERATOR_TYPE_INPUT)


def test_deploy_info_names_upstream_buffer_server_and_stream():
    clock = ManualClock()
    app = make_app(clock)
    activate_all(app, clock)  # c0 on 7000, c1 on 7001, c2 on 7002
    [relay] = process_heartbeat(app, container_heartbeat("app-0001-c1", port=7001),
                                clock()).deploy_request
    [link] = relay.inputs
    assert (link.buffer_server_host, link.buffer_server_port) == ("127.0.0.1", 7000)
    assert (link.source_node_id, link.source_port_name, link.port_name) == (1, "output", "input")
    assert link.declared_stream_id == "s1"
    [out] = relay.outputs
    assert (out.port_name, out.buffer_server_port, out.declared_stream_id) == (
        "output", 7001, "to_sink")
    assert relay.checkpoint.window_id == -1
    assert relay.context_attributes["STREAMING_WINDOW_SIZE_MILLIS"] == "500"
    assert relay.payload and relay.class_name.endswith("Relay")


def test_deploy_is_resent_until_the_operator_is_reported():
    clock = ManualClock()
    app = make_app(clock)
    activate_all(app, clock)
    for _ in range(2):
        response = process_heartbeat(app, container_heartbeat("app-0001-c0"), clock())
        assert [d.id for d in response.deploy_request] == [1]
    response = process_heartbeat(
        app, container_heartbeat("app-0001-c0", operators=[operator_report(1)]), clock())
    assert not response.deploy_request
    assert not response.has_pending_requests
    assert app.plan.operators[1].state == OperatorState.ACTIVE


def test_operator_shutdown_then_all_shutdown_finishes_and_aborts_everyone():
    clock = ManualClock()
    app = make_app(clock)
    activate_all(app, clock)
    for op_id, cid in ((1, "app-0001-c0"), (2, "app-0001-c1")):
        response = process_heartbeat(
            app, container_heartbeat(cid, operators=[operator_report(op_id, SHUTDOWN)]),
            clock())
        assert app.plan.operators[op_id].state == OperatorState.SHUTDOWN
        assert response.shutdown == umbilical_pb2.SHUTDOWN_TYPE_NONE
    assert app.state == ApplicationState.RUNNING
    clock.advance(1000)
    response = process_heartbeat(
        app, container_heartbeat("app-0001-c2", operators=[operator_report(3, SHUTDOWN)]),
        clock())
    assert app.state == ApplicationState.FINISHED
    assert app.finished_ms == clock()
    assert response.shutdown == ABORT
    for cid in ("app-0001-c0", "app-0001-c1"):
        assert process_heartbeat(app, container_heartbeat(cid), clock()).shutdown == ABORT


def test_operator_failure_restarts_its_container():
    clock = ManualClock()
    app = make_app(clock)
    activate_all(app, clock)
    process_heartbeat(app, container_heartbeat("app-0001-c1", operators=[operator_report(2)]),
                      clock())
    response = process_heartbeat(app, container_heartbeat(
        "app-0001-c1", operators=[operator_report(2, FAILED, error="ZeroDivisionError: boom")]),
        clock())
    assert response.shutdown == ABORT
    op = app.plan.operators[2]
    lost = app.plan.containers["app-0001-c1"]
    # the heartbeat only records what it asked for; the master loop's pass recovers
    assert (op.state, op.failure_count, lost.state) == (OperatorState.FAILED, 0,
                                                        ContainerState.ACTIVE)
    assert lost.loss_request.blamed_id == 2 and not app.launcher_actions
    again = process_heartbeat(app, container_heartbeat("app-0001-c1"), clock())
    assert again.shutdown == ABORT  # until its process is gone
    assert [loss.container_id for loss in check_liveness(app, clock(), {}, 5000)] == [
        "app-0001-c1"]
    assert lost.loss_request is None
    assert (op.state, op.failure_count, op.error) == (OperatorState.PENDING_DEPLOY, 1,
                                                      "ZeroDivisionError: boom")
    assert (op.container_id, app.plan.containers["app-0001-c1"].state) == (
        "app-0001-c3", ContainerState.KILLED)
    assert app.plan.operators[1].state == OperatorState.PENDING_DEPLOY  # never reported
    assert app.plan.operators[3].state == OperatorState.PENDING_UNDEPLOY  # downstream
    assert app.state == ApplicationState.RUNNING and not app.diagnostics
    assert [(a.kind, a.container_id) for a in app.take_launcher_actions()] == [
        ("kill", "app-0001-c1"), ("launch", "app-0001-c3")]


def test_window_stats_accumulate():
    clock = ManualClock()
    app = make_app(clock)
    activate_all(app, clock)
    t = clock()
    windows = [window(10 + i, tuples_in=5, tuples_out=4, end_ms=t + 500 * i,
                      cpu_ns=50_000_000) for i in range(3)]
    process_heartbeat(app, container_heartbeat(
        "app-0001-c1", operators=[operator_report(2, windows=windows)]), clock())
    # a repeated window is not counted twice
    process_heartbeat(app, container_heartbeat(
        "app-0001-c1", operators=[operator_report(2, windows=windows[-1:])]), clock())
    stats = app.operator_stats[2]
    assert (stats.total_tuples_processed, stats.total_tuples_emitted) == (15, 12)
    assert stats.current_window_id == 12 and stats.windows_processed == 3
    assert stats.tuples_processed_per_second == 10.0  # 10 tuples over 1 s
    assert stats.cpu_percent == 10.0  # 100 ms of CPU over 1 s


def test_reported_operator_not_planned_there_is_undeployed():
    clock = ManualClock()
    app = make_app(clock)
    activate_all(app, clock)
    response = process_heartbeat(
        app, container_heartbeat("app-0001-c0", operators=[operator_report(3)]), clock())
    assert list(response.undeploy_request) == [3]
    assert app.plan.operators[3].state == OperatorState.PENDING_DEPLOY


def test_shutdown_request_answers_wait_terminate():
    clock = ManualClock()
    app = make_app(clock)
    activate_all(app, clock)
    app.shutdown_requested = True
    response = process_heartbeat(app, container_heartbeat("app-0001-c0"), clock())
    assert response.shutdown == WAIT
    assert [d.id for d in response.deploy_request] == [1]  # deploys still go out


def test_killed_container_gets_abort():
    clock = ManualClock()
    app = make_app(clock)
    activate_all(app, clock)
    app.plan.containers["app-0001-c1"].transition(ContainerState.KILLED)
    assert process_heartbeat(app, container_heartbeat("app-0001-c1"), clock()).shutdown == ABORT


def test_container_started_by_hand_goes_new_to_active():
    clock = ManualClock()
    dag = chain_descriptor(3)
    app = Application("app-0001", dag, build_physical_plan(dag, {}, "app-0001"), clock())
    process_heartbeat(app, container_heartbeat("app-0001-c0"), clock())
    assert app.plan.containers["app-0001-c0"].state == ContainerState.ACTIVE


def test_liveness_silent_container_is_lost_and_replaced():
    clock = ManualClock()
    app = make_app(clock, HEARTBEAT_TIMEOUT_MILLIS="3000")
    activate_all(app, clock)
    clock.advance(2500)
    for cid in ("app-0001-c0", "app-0001-c2"):
        process_heartbeat(app, container_heartbeat(cid), clock())
    assert check_liveness(app, clock(), {}, stop_grace_ms=5000) == []
    clock.advance(600)  # c1 silent for 3.1 s
    [loss] = check_liveness(app, clock(), {}, stop_grace_ms=5000)
    assert loss.container_id == "app-0001-c1" and "no heartbeat for 3100 ms" in loss.cause
    assert loss.replacement_id == "app-0001-c3"
    container = app.plan.containers["app-0001-c1"]
    assert container.state == ContainerState.KILLED
    assert app.state == ApplicationState.RUNNING
    relay = app.plan.operators[2]
    assert relay.state == OperatorState.PENDING_DEPLOY and relay.failure_count == 1
    assert "app-0001-c1 lost: no heartbeat" in relay.error
    assert process_heartbeat(app, container_heartbeat("app-0001-c1"), clock()).shutdown == ABORT
    # its process may still run: the launcher is asked for its thread dump before the kill
    [kill] = [a for a in app.launcher_actions if a.container_id == "app-0001-c1"]
    assert kill.dump_threads


def test_liveness_never_phoned_home_and_process_exit():
    clock = ManualClock()
    app = make_app(clock, HEARTBEAT_TIMEOUT_MILLIS="1000")
    clock.advance(1500)
    process_heartbeat(app, container_heartbeat("app-0001-c0"), clock())
    losses = check_liveness(app, clock(), {"app-0001-c1": 3}, stop_grace_ms=5000)
    assert [(x.container_id, x.cause, x.replacement_id) for x in losses] == [
        ("app-0001-c1", "its process exited with code 3", "app-0001-c3")]
    assert not any(a.dump_threads for a in app.launcher_actions)  # no process to ask
    assert app.state == ApplicationState.ACCEPTED
    clock.advance(600)  # c2: launched 2.1 s ago, never heard of
    [loss] = check_liveness(app, clock(), {}, stop_grace_ms=60_000)
    assert loss.container_id == "app-0001-c2" and "never sent a heartbeat" in loss.cause
    assert loss.replacement_id == "app-0001-c4"
    assert app.plan.containers["app-0001-c3"].state == ContainerState.NEW  # to be launched
    assert check_liveness(app, clock(), {}, stop_grace_ms=60_000) == []


def test_never_phoned_home_within_twice_the_timeout():
    clock = ManualClock()
    app = make_app(clock, HEARTBEAT_TIMEOUT_MILLIS="1000")
    activate_all(app, clock)
    app.plan.containers["app-0001-c2"].state = ContainerState.ALLOCATED  # as if it never spoke
    clock.advance(900)
    for cid in ("app-0001-c0", "app-0001-c1"):
        process_heartbeat(app, container_heartbeat(cid), clock())
    assert check_liveness(app, clock(), {}, 5000) == []
    clock.advance(900)
    for cid in ("app-0001-c0", "app-0001-c1"):
        process_heartbeat(app, container_heartbeat(cid), clock())
    clock.advance(300)
    [loss] = check_liveness(app, clock(), {}, 5000)
    assert loss.container_id == "app-0001-c2" and "never sent a heartbeat" in loss.cause


def test_containers_of_an_ended_app_are_recorded_then_stopped():
    clock = ManualClock()
    app = make_app(clock)
    activate_all(app, clock)
    app.transition(ApplicationState.KILLED, clock(), "killed by the user")
    losses = check_liveness(app, clock(), {"app-0001-c0": 0}, stop_grace_ms=2000)
    assert [x.container_id for x in losses] == ["app-0001-c0"]
    assert app.state == ApplicationState.KILLED and app.diagnostics == "killed by the user"
    clock.advance(2000)
    losses = check_liveness(app, clock(), {}, stop_grace_ms=2000)
    assert [x.container_id for x in losses] == ["app-0001-c1", "app-0001-c2"]
    assert all(c.state == ContainerState.KILLED for c in app.plan.containers.values())


def test_inputs_are_activated_only_once_every_operator_is_ready():
    clock = ManualClock()
    app = make_app(clock)  # operators 1 (input), 2, 3 in containers c0, c1, c2
    activate_all(app, clock)

    def beat(cid: str, op: int, ready: bool) -> umbilical_pb2.ContainerHeartbeatResponse:
        port = 7000 + int(cid[-1])
        return process_heartbeat(app, container_heartbeat(
            cid, port=port, operators=[operator_report(op, ready=ready)]), clock())

    assert not beat("app-0001-c0", 1, True).activate_request
    assert not beat("app-0001-c1", 2, True).activate_request
    assert not beat("app-0001-c2", 3, False).activate_request  # Spark still warming
    assert not beat("app-0001-c0", 1, True).activate_request
    assert not beat("app-0001-c2", 3, True).activate_request  # no input operator there
    assert list(beat("app-0001-c0", 1, True).activate_request) == [1]


def test_deploy_info_carries_the_schema_the_dag_knew_for_an_input_stream():
    clock = ManualClock()
    app = make_app(clock)
    activate_all(app, clock)
    schema = pa.schema([("word", pa.string())])
    relay = next(op for op in app.dag.operators if op.class_name.endswith("Relay"))
    relay.inputs[0].stream_schema = schema.serialize().to_pybytes()
    [info] = process_heartbeat(app, container_heartbeat("app-0001-c1", port=7001),
                               clock()).deploy_request
    [link] = info.inputs
    assert pa.ipc.read_schema(pa.py_buffer(link.stream_schema)) == schema
    [sink] = [i for i in app.dag.operators if i.name != relay.name and i.inputs]
    assert not sink.inputs[0].stream_schema  # none known: none sent
