"""The real MasterServer over gRPC, with containers played by hand through the generated stubs.

The launcher starts nothing (RecordingLauncher): each test is the containers.
"""

from __future__ import annotations

import functools
import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Callable

import grpc
import pytest

from tests.harness import master_channel, poll_for
from tests.master.fakes import (
    ManualClock,
    chain_descriptor,
    container_heartbeat,
    operator_report,
    window,
)
from weir.master.client import WeirClient, WeirClientError
from weir.master.launcher import RecordingLauncher
from weir.master.server import MasterServer
from weir.operators.windows import make_window_id, window_counter
from weir.proto import client_pb2, client_pb2_grpc, umbilical_pb2, umbilical_pb2_grpc

pytestmark = pytest.mark.timeout(60)

ACTIVE = umbilical_pb2.OPERATOR_STATE_ACTIVE
SHUTDOWN = umbilical_pb2.OPERATOR_STATE_SHUTDOWN
FAILED = umbilical_pb2.OPERATOR_STATE_FAILED
ABORT = umbilical_pb2.SHUTDOWN_TYPE_ABORT
C0, C1, C2 = "app-0001-c0", "app-0001-c1", "app-0001-c2"


@pytest.fixture
def server():
    master = MasterServer(launcher_factory=RecordingLauncher, loop_interval_s=0.05,
                          container_stop_grace_ms=300)
    master.start()
    try:
        yield master
    finally:
        master.stop()


@pytest.fixture
def client(server):
    with WeirClient(server.address, timeout_s=5) as weir:
        yield weir


@pytest.fixture
def umbilical(server):
    channel = master_channel(server.address, server.secret)
    try:
        yield umbilical_pb2_grpc.StreamingContainerUmbilicalStub(channel)
    finally:
        channel.close()


def beat(umbilical, cid: str, port: int, *reports: umbilical_pb2.OperatorHeartbeat
         ) -> umbilical_pb2.ContainerHeartbeatResponse:
    return umbilical.ProcessHeartbeat(container_heartbeat(cid, port=port, operators=reports),
                                      timeout=5)


def deploy_all(client, umbilical) -> str:
    """Submits a 3-operator chain over 3 containers and plays them up to all ACTIVE."""
    app_id = client.submit(chain_descriptor(3), {"CONTAINERS": "3"})
    for cid, port in ((C0, 7000), (C1, 7001), (C2, 7002)):
        beat(umbilical, cid, port)
    for op_id, (cid, port) in enumerate(((C0, 7000), (C1, 7001), (C2, 7002)), start=1):
        assert [d.id for d in beat(umbilical, cid, port).deploy_request] == [op_id]
        beat(umbilical, cid, port, operator_report(op_id))
    return app_id


def states(client, app_id: str) -> dict[str, str]:
    return {op.name: op.state for op in client.operators(app_id)}


def window_ids(client, app_id: str) -> Callable[[int], int]:
    """Window ids of the application by counter, in its epoch (as its containers number them)."""
    return functools.partial(make_window_id, client.application(app_id).start_window_millis // 1000)


def test_submit_launches_and_init_context_has_the_configuration(server, client, umbilical):
    app_id = client.submit(chain_descriptor(3), {"CONTAINERS": "3",
                                                 "STREAMING_WINDOW_SIZE_MILLIS": "250"})
    assert app_id == "app-0001"
    assert server.launcher.launched == [C0, C1, C2]
    context = umbilical.GetInitContext(umbilical_pb2.GetInitContextRequest(container_id=C1),
                                       timeout=5)
    assert (context.container_id, context.application_id) == (C1, app_id)
    assert context.streaming_window_size_millis == 250
    assert context.heartbeat_interval_millis == 500
    assert context.checkpoint_window_count == 20
    assert context.deploy_buffer_server
    assert context.start_window_millis > 0 and context.start_window_millis % 1000 == 0
    assert context.attributes["CONTAINERS"] == "3"
    info = client.application(app_id)
    assert (info.state, info.containers_planned, info.operators) == ("ACCEPTED", 3, 3)
    assert [c.state for c in client.containers(app_id)] == ["ALLOCATED"] * 3


def test_deploy_requests_name_upstream_buffer_servers(client, umbilical):
    client.submit(chain_descriptor(3), {"CONTAINERS": "3"})
    assert not beat(umbilical, C0, 7000).deploy_request
    assert not beat(umbilical, C1, 7001).deploy_request
    [sink] = beat(umbilical, C2, 7002).deploy_request
    [relay] = beat(umbilical, C1, 7001).deploy_request
    [source] = beat(umbilical, C0, 7000).deploy_request
    assert (source.name, source.inputs, source.outputs[0].buffer_server_port) == (
        "source", [], 7000)
    assert (relay.inputs[0].buffer_server_host, relay.inputs[0].buffer_server_port) == (
        "127.0.0.1", 7000)
    assert (relay.inputs[0].source_node_id, relay.inputs[0].source_port_name) == (1, "output")
    assert (sink.inputs[0].buffer_server_port, sink.inputs[0].source_node_id) == (7001, 2)
    containers = {c.id: c for c in client.containers()}
    assert containers[C1].buffer_server_address == "127.0.0.1:7001"
    assert containers[C1].state == "ACTIVE" and containers[C1].process_name == "7001@testhost"


def test_reported_states_and_stats_show_in_the_client_api(client, umbilical):
    app_id = deploy_all(client, umbilical)
    assert states(client, app_id) == {"source": "ACTIVE", "relay1": "ACTIVE", "sink": "ACTIVE"}
    info = client.application(app_id)
    assert (info.state, info.containers_active) == ("RUNNING", 3)
    w = window_ids(client, app_id)
    windows = [window(w(100 + i), tuples_in=10, tuples_out=7, end_ms=1_000 + 500 * i)
               for i in range(3)]
    beat(umbilical, C1, 7001, operator_report(2, windows=windows))
    relay = client.operator_stats(app_id, "relay1")
    assert (relay.total_tuples_processed, relay.total_tuples_emitted) == (30, 21)
    assert relay.current_window_id == w(102) and relay.windows_processed == 3
    assert [r.window_id for r in relay.recent_windows] == [w(100), w(101), w(102)]
    assert relay.tuples_processed_per_second == 20.0
    assert {p.name: p.total_tuples for p in relay.ports} == {"input": 30, "output": 21}
    assert client.operator_stats(app_id, 2).name == "relay1"
    beat(umbilical, C0, 7000, operator_report(1, SHUTDOWN))
    assert states(client, app_id)["source"] == "SHUTDOWN"
    assert client.application(app_id).state == "RUNNING"


def test_operator_failure_restarts_its_container(server, client, umbilical):
    app_id = deploy_all(client, umbilical)
    response = beat(umbilical, C2, 7002, operator_report(3, FAILED, error="KeyError: 'word'"))
    assert response.shutdown == ABORT
    # the master loop, woken by the ABORT, gives the container up (not the heartbeat)
    poll_for(lambda: server.launcher.killed == [C2], 5, "the master loop to give up on c2")
    assert server.launcher.launched == [C0, C1, C2, "app-0001-c3"]
    ops = {op.name: op for op in client.operators(app_id)}
    assert (ops["sink"].state, ops["sink"].container_id) == ("PENDING_DEPLOY", "app-0001-c3")
    assert ops["sink"].error == "KeyError: 'word'" and ops["sink"].failure_count == 1
    assert ops["relay1"].state == "ACTIVE" and ops["relay1"].failure_count == 0
    info = client.application(app_id)
    assert (info.state, info.operators_failed, info.operator_failures, info.recoveries) == (
        "RUNNING", 0, 1, 1)
    assert "app-0001-c2 lost" in info.last_recovery and "app-0001-c3" in info.last_recovery
    # the new container joins and gets the sink, fed by relay1's buffer server
    [sink] = beat(umbilical, "app-0001-c3", 7003).deploy_request
    assert (sink.id, sink.checkpoint.window_id) == (3, -1)
    assert (sink.inputs[0].buffer_server_port, sink.outputs) == (7001, [])
    assert beat(umbilical, C2, 7002).shutdown == ABORT


def test_shutdown_then_all_shutdown_finishes(server, client, umbilical):
    app_id = deploy_all(client, umbilical)
    client.shutdown(app_id)
    assert beat(umbilical, C0, 7000).shutdown == umbilical_pb2.SHUTDOWN_TYPE_WAIT_TERMINATE
    for op_id, (cid, port) in enumerate(((C0, 7000), (C1, 7001), (C2, 7002)), start=1):
        beat(umbilical, cid, port, operator_report(op_id, SHUTDOWN))
    final = server.wait_for_application(app_id, timeout_s=5)
    assert final.state == "FINISHED" and final.finished_ms >= final.submitted_ms
    assert beat(umbilical, C1, 7001).shutdown == ABORT
    with pytest.raises(WeirClientError, match="already FINISHED"):
        client.shutdown(app_id)
    # the containers never exit (nothing runs them): the master loop stops them
    poll_for(lambda: sorted(server.launcher.killed) == [C0, C1, C2], 5,
             "the lingering containers to be stopped")


def test_kill_application_aborts_containers(server, client, umbilical):
    app_id = deploy_all(client, umbilical)
    client.kill(app_id, "enough")
    info = client.application(app_id)
    assert (info.state, info.diagnostics) == ("KILLED", "enough")
    assert beat(umbilical, C0, 7000).shutdown == ABORT
    poll_for(lambda: all(c.state == "KILLED" for c in client.containers(app_id)), 5,
             "the containers to be stopped")


def test_wait_names_a_running_application_at_its_timeout_and_returns_its_end(client,
                                                                            umbilical):
    app_id = deploy_all(client, umbilical)
    seen: list[str] = []
    with pytest.raises(TimeoutError, match=f"application {app_id} is still RUNNING after "
                                           r"0.3 s \(committed window "):
        client.wait(app_id, 0.3, interval_s=0.05, on_poll=lambda info: seen.append(info.state))
    assert len(seen) >= 2 and set(seen) == {"RUNNING"}
    client.kill(app_id, "enough")
    assert client.wait(app_id, 5).state == "KILLED"


def test_kill_container_replaces_it(server, client, umbilical):
    app_id = deploy_all(client, umbilical)
    assert client.kill_container(C1) == "app-0001-c3"
    assert server.launcher.killed == [C1]
    assert server.launcher.launched[-1] == "app-0001-c3"
    info = client.application(app_id)
    assert info.state == "RUNNING" and info.recoveries == 1 and info.containers_replaced == 1
    containers = {c.id: c for c in client.containers(app_id)}
    assert containers[C1].state == "KILLED" and "killed by the user" in containers[C1].diagnostics
    assert containers[C1].replaced_by == "app-0001-c3"
    assert (containers["app-0001-c3"].state, containers["app-0001-c3"].replaces) == (
        "ALLOCATED", C1)
    assert states(client, app_id) == {"source": "ACTIVE", "relay1": "PENDING_DEPLOY",
                                      "sink": "PENDING_UNDEPLOY"}
    assert beat(umbilical, C1, 7001).shutdown == ABORT
    with pytest.raises(WeirClientError, match="already KILLED"):
        client.kill_container(C1)


def test_exited_container_is_replaced_by_the_master_loop(server, client, umbilical):
    app_id = deploy_all(client, umbilical)
    server.launcher.set_exit_code(C2, 137)
    poll_for(lambda: "app-0001-c3" in server.launcher.launched, 5,
             "a new container to replace the exited one")
    containers = {c.id: c for c in client.containers(app_id)}
    assert containers[C2].diagnostics == "its process exited with code 137"
    assert client.application(app_id).state == "RUNNING"


def test_errors_are_status_codes_with_one_line(server, client, umbilical):
    channel = master_channel(server.address, server.secret)
    stub = client_pb2_grpc.WeirClientStub(channel)
    with pytest.raises(grpc.RpcError) as caught:
        stub.GetApplicationInfo(client_pb2.GetApplicationInfoRequest(application_id="app-0042"),
                                timeout=5)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == ("unknown application 'app-0042'; `weir apps` lists the "
                                      "applications")
    with pytest.raises(grpc.RpcError) as caught:
        umbilical.GetInitContext(umbilical_pb2.GetInitContextRequest(container_id="x"),
                                 timeout=5)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    dag = chain_descriptor(3)
    del dag.streams[0]  # relay1.input left unconnected
    with pytest.raises(grpc.RpcError) as caught:
        stub.SubmitApplication(client_pb2.SubmitApplicationRequest(dag=dag), timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input port relay1.input is not connected" in caught.value.details()
    dag = chain_descriptor(3)
    dag.operators[1].attributes["EVENT_TIME_COLUMN"] = "ts"  # relay1: not a source
    with pytest.raises(WeirClientError, match="operator 'relay1' sets EVENT_TIME_COLUMN, which "
                                              "only a source"):
        client.submit(dag)
    with pytest.raises(WeirClientError, match="unknown attribute 'BOGUS'") as caught_client:
        client.submit(chain_descriptor(3), {"BOGUS": "1"})
    assert caught_client.value.code == grpc.StatusCode.INVALID_ARGUMENT
    app_id = client.submit(chain_descriptor(3))
    with pytest.raises(WeirClientError, match="has no operator 'ghost'"):
        client.operator_stats(app_id, "ghost")
    # an unknown container heartbeating is told to stop, not answered with an error
    assert beat(umbilical, "stranger", 1).shutdown == ABORT
    assert client.applications()[0].id == app_id
    channel.close()


def test_unreachable_master_is_one_clear_line():
    with WeirClient("127.0.0.1:1", timeout_s=5) as weir, pytest.raises(
            WeirClientError, match=r"^no master answers at 127\.0\.0\.1:1; start one with "
                                   r"`weir master` or pass --master$"):
        weir.applications()
    with pytest.raises(WeirClientError, match="bad master address 'x': expected HOST:PORT"):
        WeirClient("x")


def test_stop_is_idempotent_and_stops_the_launcher():
    master = MasterServer(launcher_factory=RecordingLauncher)
    address = master.start()
    assert address.startswith("127.0.0.1:") and int(address.rsplit(":", 1)[1]) > 0
    launcher = master.launcher
    master.stop()
    master.stop()
    assert launcher.stopped


def checkpointed(umbilical, cid: str, port: int, op_id: int, *window_ids: int
                 ) -> umbilical_pb2.ContainerHeartbeatResponse:
    windows = [window(w, checkpoint=w, checkpoint_ms=10 * (i + 1),
                      end_ms=1_000 + window_counter(w)) for i, w in enumerate(window_ids)]
    return beat(umbilical, cid, port, operator_report(op_id, windows=windows))


def test_checkpoints_committed_window_and_their_stats(server, client, umbilical):
    app_id = deploy_all(client, umbilical)
    w = window_ids(client, app_id)
    checkpointed(umbilical, C0, 7000, 1, w(20), w(40), w(60))
    checkpointed(umbilical, C1, 7001, 2, w(20), w(40))
    assert checkpointed(umbilical, C2, 7002, 3, w(20)).committed_window_id == w(20)
    assert checkpointed(umbilical, C2, 7002, 3, w(40)).committed_window_id == w(40)
    assert beat(umbilical, C0, 7000).committed_window_id == w(40)
    info = client.application(app_id)
    assert (info.committed_window_id, info.current_window_id) == (w(40), w(40))
    source = client.operator_stats(app_id, "source")
    assert (source.checkpoint_window_id, source.recovery_window_id, source.checkpoints) == (
        w(60), w(40), 3)
    assert (source.checkpoint_time_ms, source.checkpoint_time_avg_ms) == (30, 20.0)
    assert (source.processing_mode, source.max_restarts, source.deploy_window_id) == (
        "AT_LEAST_ONCE", 5, -1)


def test_deploy_after_recovery_names_the_new_containers_buffer_server(server, client,
                                                                      umbilical):
    app_id = deploy_all(client, umbilical)
    w = window_ids(client, app_id)
    for cid, port, op_id in ((C0, 7000, 1), (C1, 7001, 2), (C2, 7002, 3)):
        checkpointed(umbilical, cid, port, op_id, w(20), w(40))
    client.kill_container(C1)
    assert server.launcher.launched == [C0, C1, C2, "app-0001-c3"]
    assert list(beat(umbilical, C2, 7002, operator_report(3)).undeploy_request) == [3]
    assert not beat(umbilical, C0, 7000, operator_report(1)).deploy_request  # untouched
    assert not beat(umbilical, C2, 7002).deploy_request  # undeployed; c3 not there yet
    [relay] = beat(umbilical, "app-0001-c3", 7103).deploy_request
    assert (relay.id, relay.checkpoint.window_id, relay.inputs[0].buffer_server_port) == (
        2, w(40), 7000)
    [sink] = beat(umbilical, C2, 7002).deploy_request
    assert (sink.id, sink.checkpoint.window_id) == (3, w(40))
    assert (sink.inputs[0].buffer_server_host, sink.inputs[0].buffer_server_port) == (
        "127.0.0.1", 7103)
    beat(umbilical, "app-0001-c3", 7103, operator_report(2))
    beat(umbilical, C2, 7002, operator_report(3))
    assert states(client, app_id) == {"source": "ACTIVE", "relay1": "ACTIVE", "sink": "ACTIVE"}
    info = client.application(app_id)
    assert (info.state, info.containers_active, info.containers_planned) == ("RUNNING", 3, 3)
    assert info.committed_window_id == w(40) and info.operator_failures == 1


def test_restart_limit_fails_the_application_visibly(server, client, umbilical):
    app_id = client.submit(chain_descriptor(2), {"CONTAINERS": "2", "sink.MAX_RESTARTS": "2"})
    beat(umbilical, C0, 7000)
    cid = C1
    for attempt in range(3):
        response = beat(umbilical, cid, 7001,
                        operator_report(2, FAILED, error=f"ValueError: bad row {attempt}"))
        assert response.shutdown == ABORT
        cid = poll_for(lambda lost=cid: next(  # the master loop gives it up, woken
            (op.container_id for op in client.operators(app_id)
             if op.name == "sink" and op.container_id != lost), None)
            or client.application(app_id).state == "FAILED", 5, "the sink's replacement")
    info = client.application(app_id)
    assert info.state == "FAILED" and info.recoveries == 2 and info.operators_failed == 1
    assert info.diagnostics == ("operator 'sink' (2) failed 3 times in a row without a new "
                                "checkpoint (MAX_RESTARTS=2); last error: ValueError: bad row 2")
    sink = client.operator_stats(app_id, "sink")
    assert (sink.state, sink.failure_count, sink.failures_in_a_row) == ("FAILED", 3, 3)


def test_state_dir_travels_to_every_container(server, client, umbilical):
    app_id = client.submit(chain_descriptor(2), {"CONTAINERS": "2"})
    state_dir = client.application(app_id).attributes["STATE_DIR"]
    assert state_dir.startswith(os.path.join(tempfile.gettempdir(),
                                              f"weir-state-{os.getuid()}", f"{app_id}-"))
    assert os.path.isfile(os.path.join(state_dir, "OWNER.json"))  # claimed at submit
    context = umbilical.GetInitContext(umbilical_pb2.GetInitContextRequest(container_id=C1),
                                       timeout=5)
    assert context.attributes["STATE_DIR"] == state_dir
    beat(umbilical, C0, 7000)
    [sink] = beat(umbilical, C1, 7001).deploy_request
    assert sink.context_attributes["STATE_DIR"] == state_dir
    assert client.application(app_id).attributes["STATE_DIR"] == state_dir


def test_the_master_deletes_nothing(server, client, umbilical, tmp_path, monkeypatch):
    """Checkpoint files are the containers' to delete; the master only keeps the books."""
    files = [tmp_path / "checkpoints" / str(op) / f"{w:016x}.ckpt" for op in (1, 2, 3)
             for w in (20, 40)]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"state")

    def refuse(*args, **kwargs):
        raise AssertionError(f"the master deleted something: {args}")

    for module, name in ((os, "remove"), (os, "unlink"), (os, "rmdir"),
                         (shutil, "rmtree"), (pathlib.Path, "unlink"), (pathlib.Path, "rmdir")):
        monkeypatch.setattr(module, name, refuse)
    app_id = client.submit(chain_descriptor(3), {"CONTAINERS": "3", "STATE_DIR": str(tmp_path)})
    w = window_ids(client, app_id)
    for cid, port in ((C0, 7000), (C1, 7001), (C2, 7002)):
        beat(umbilical, cid, port)
    for op_id, (cid, port) in enumerate(((C0, 7000), (C1, 7001), (C2, 7002)), start=1):
        beat(umbilical, cid, port)
        checkpointed(umbilical, cid, port, op_id, w(20), w(40))
    assert client.application(app_id).committed_window_id == w(40)
    client.kill_container(C2)
    beat(umbilical, "app-0001-c3", 7003)
    checkpointed(umbilical, "app-0001-c3", 7003, 3, w(60))
    server.launcher.set_exit_code(C0, 9)
    poll_for(lambda: client.application(app_id).recoveries == 2, 5, "the second recovery")
    monkeypatch.undo()
    assert all(path.read_bytes() == b"state" for path in files)


def test_a_deploy_error_restarts_the_container(server, client, umbilical):
    app_id = deploy_all(client, umbilical)
    request = umbilical_pb2.ReportErrorRequest(container_id=C1, operators=[2], msg="late")
    umbilical.ReportError(request, timeout=5)  # about a running operator: only recorded
    assert client.application(app_id).recoveries == 0
    client.kill_container(C2)
    [sink] = beat(umbilical, "app-0001-c3", 7003).deploy_request
    umbilical.ReportError(umbilical_pb2.ReportErrorRequest(
        container_id="app-0001-c3", operators=[3], msg="cannot restore checkpoint"), timeout=5)
    assert server.launcher.killed == [C2, "app-0001-c3"]
    assert server.launcher.launched[-1] == "app-0001-c4"
    op = client.operator_stats(app_id, "sink")
    assert (op.failure_count, op.error) == (2, "cannot restore checkpoint")


def test_a_blocked_operator_is_found_by_the_master_loop():
    clock = ManualClock()
    master = MasterServer(launcher_factory=RecordingLauncher, clock=clock, loop_interval_s=0.05)
    master.start()
    try:
        with WeirClient(master.address, timeout_s=5) as weir:
            channel = master_channel(master.address, master.secret)
            umbilical = umbilical_pb2_grpc.StreamingContainerUmbilicalStub(channel)
            app_id = weir.submit(chain_descriptor(3), {"CONTAINERS": "3",
                                                       "relay1.TIMEOUT_WINDOW_COUNT": "4"})
            w = window_ids(weir, app_id)
            for cid, port in ((C0, 7000), (C1, 7001), (C2, 7002)):
                beat(umbilical, cid, port)
            for op_id, (cid, port) in enumerate(((C0, 7000), (C1, 7001), (C2, 7002)), start=1):
                beat(umbilical, cid, port)
                beat(umbilical, cid, port, operator_report(op_id, windows=[window(w(1))]))
            clock.advance(1000)  # 2 windows of 500 ms: not yet
            beat(umbilical, C0, 7000, operator_report(1, windows=[window(w(2)), window(w(3))]))
            time.sleep(0.2)
            assert master.launcher.killed == []
            clock.advance(1500)  # the relay stood still 2.5 s > 4 x 500 ms, with data waiting
            for cid, port in ((C0, 7000), (C1, 7001), (C2, 7002)):
                beat(umbilical, cid, port)
            poll_for(lambda: master.launcher.killed == [C1], 5, "the blocked relay's container")
            assert master.launcher.dumped == [C1]  # its threads' stacks asked for first
            relay = weir.operator_stats(app_id, "relay1")
            assert relay.failure_count == 1 and "is blocked" in relay.error
            assert master.launcher.launched[-1] == "app-0001-c3"
            channel.close()
    finally:
        master.stop()


@pytest.mark.parametrize("method", ["/weir.v1.WeirClient/SubmitApplication",
                                    "/weir.v1.StreamingContainerUmbilical/ProcessHeartbeat"])
def test_bytes_that_are_no_message_are_the_callers_error(server, method):
    """INVALID_ARGUMENT with protobuf's reason, not INTERNAL (issue 17, item 12)."""
    with master_channel(server.address, server.secret) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            channel.unary_unary(method)(b"\xff\xff\xff", timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not a valid message" in caught.value.details()
    assert "Wire format was corrupt" in caught.value.details()


def test_an_operator_named_with_a_digit_int_cannot_read_is_not_found(client, server):
    """'²' is a digit to str.isdigit but not to int(): it must not become INTERNAL."""
    app_id = client.submit(chain_descriptor(2))
    for name in ("²", "١٢٣٤"):  # a superscript; Arabic-Indic digits (an id int() reads)
        with pytest.raises(WeirClientError, match="has no operator") as caught:
            client.operator_stats(app_id, name)
        assert caught.value.code == grpc.StatusCode.NOT_FOUND
