"""The heartbeat loop outlives a master's error answers (issue 17, item 4): an INTERNAL
reply, or a master that stopped, is retried like an unreachable master, not fatal."""

from __future__ import annotations

import threading
import types

import grpc
import pytest

from weir.container.heartbeat_loop import HeartbeatLoop
from weir.container.lease import Lease
from weir.proto import plan_pb2, umbilical_pb2

pytestmark = pytest.mark.timeout(30)


class _Refused(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INTERNAL

    def details(self) -> str:
        return "internal error in the master: KeyError: 'x'"


class _Client:
    """Refuses the first ``refusals`` heartbeats, then answers ABORT."""

    def __init__(self, refusals: int, retry_window_s: float = 30.0) -> None:
        self.refusals = refusals
        self.retry_window_s = retry_window_s
        self.calls = 0

    def heartbeat(self, heartbeat):
        self.calls += 1
        if self.calls <= self.refusals:
            raise _Refused()
        return umbilical_pb2.ContainerHeartbeatResponse(
            shutdown=umbilical_pb2.SHUTDOWN_TYPE_ABORT)


_STATS = types.SimpleNamespace(process_name="1@host", pid=1, host="host",
                               sample=lambda: types.SimpleNamespace(
    memory_mb_free=1, memory_rss_mb=1, cpu_percent=0.0, gc_collection_count=0,
    gc_collection_time_ms=0))
_BUFFER_SERVER = types.SimpleNamespace(room=lambda: umbilical_pb2.BufferServerStats(
    memory_limit_bytes=256 << 20, memory_bytes=3 << 20))
_DEPLOYMENT = types.SimpleNamespace(heartbeats=lambda interval_ms: [], runners={},
                                    buffer_server=_BUFFER_SERVER)


def _loop(client: _Client, lease: Lease | None = None) -> HeartbeatLoop:
    return HeartbeatLoop("app-0001-c0", client, _DEPLOYMENT, _STATS,  # type: ignore[arg-type]
                         ("127.0.0.1", 7001), 20, lease)


def test_an_internal_error_answer_is_retried_not_fatal():
    client = _Client(refusals=3)
    assert _loop(client).run() == "aborted by the master"  # it got to the 4th answer
    assert client.calls == 4


def test_each_heartbeat_carries_the_buffer_servers_room():
    sent = _loop(_Client(refusals=0)).build()
    assert sent.buffer_server.memory_limit_bytes == 256 << 20
    assert sent.buffer_server.memory_bytes == 3 << 20


def test_a_master_that_keeps_refusing_is_left_after_the_retry_window():
    lease = Lease(10_000)
    lease.renew(0.0)
    client = _Client(refusals=10**9, retry_window_s=0.3)
    assert _loop(client, lease).run() == "master kept refusing"
    assert client.calls > 1 and not lease.valid


class _SlowDeployment:
    """A deployment whose deploys wait for ``release``; records what it did."""

    def __init__(self) -> None:
        self.runners: dict = {}
        self.buffer_server = _BUFFER_SERVER
        self.release = threading.Event()
        self.deployed: list[int] = []

    def heartbeats(self, interval_ms):
        return []

    def deploy(self, info) -> None:
        self.release.wait(20)
        self.deployed.append(info.id)

    def undeploy(self, ids) -> None:
        self.deployed = [i for i in self.deployed if i not in ids]

    def committed(self, window_id: int) -> None:
        pass


class _Beats:
    """Answers the first heartbeat with a deploy request, then plain answers; counts."""

    retry_window_s = 30.0

    def __init__(self, stop_after: int) -> None:
        self.beats: list[umbilical_pb2.ContainerHeartbeat] = []
        self.stop_after = stop_after

    def heartbeat(self, heartbeat):
        self.beats.append(heartbeat)
        if len(self.beats) == 1:
            return umbilical_pb2.ContainerHeartbeatResponse(deploy_request=[
                plan_pb2.OperatorDeployInfo(id=7, name="slow", generation=1)])
        if len(self.beats) >= self.stop_after:
            return umbilical_pb2.ContainerHeartbeatResponse(
                shutdown=umbilical_pb2.SHUTDOWN_TYPE_ABORT)
        return umbilical_pb2.ContainerHeartbeatResponse()


def test_a_slow_deploy_does_not_hold_heartbeats_back():
    """Issue 18: the deploy waits in its own thread while heartbeats go on, and they report
    the operator as setting up (so the master does not resend its deploy request)."""
    deployment = _SlowDeployment()
    client = _Beats(stop_after=4)
    loop = HeartbeatLoop("app-0001-c0", client, deployment, _STATS,  # type: ignore[arg-type]
                         ("127.0.0.1", 7001), 20)
    try:
        assert loop.run() == "aborted by the master"  # four heartbeats, the deploy unfinished
        assert deployment.deployed == []
        [placeholder] = client.beats[-1].stats.operators
        assert (placeholder.node_id, placeholder.ready, placeholder.generation) == (7, False, 1)
        deployment.release.set()
        assert loop.deploys.wait_idle(10) and deployment.deployed == [7]
    finally:
        deployment.release.set()
        loop.close()


def test_an_answer_becomes_instructions_in_the_order_they_are_carried_out():
    from weir.container.heartbeat_reply import Activate, Commit, EndInputs, Redeploy, instructions

    info = plan_pb2.OperatorDeployInfo(id=4, generation=2)
    reply = umbilical_pb2.ContainerHeartbeatResponse(
        undeploy_request=[4], deploy_request=[info], activate_request=[1, 2],
        shutdown=umbilical_pb2.SHUTDOWN_TYPE_WAIT_TERMINATE, committed_window_id=9)
    assert instructions(reply, committed_window_id=8) == [
        Redeploy((4,), (info,)), Activate((1, 2)), EndInputs(), Commit(9)]
    assert instructions(reply, committed_window_id=9)[-1] == EndInputs()  # no news: no Commit
    assert instructions(umbilical_pb2.ContainerHeartbeatResponse(), 5) == []


def test_a_savepoint_is_a_stop_for_it_or_one_taken_while_running():
    from weir.container.heartbeat_reply import EndInputs, TakeSavepoint, instructions

    stop = umbilical_pb2.ContainerHeartbeatResponse(
        shutdown=umbilical_pb2.SHUTDOWN_TYPE_WAIT_TERMINATE, savepoint_path="/sp",
        savepoint_window_id=-1, committed_window_id=3)
    assert instructions(stop, committed_window_id=3) == [EndInputs("/sp")]
    running = umbilical_pb2.ContainerHeartbeatResponse(
        savepoint_path="/sp", savepoint_window_id=40, committed_window_id=3)
    assert instructions(running, committed_window_id=3) == [TakeSavepoint("/sp", 40)]


def test_a_spare_heartbeats_at_its_pace_until_given_operators_and_says_when_spark_is_warm():
    deployment = _SlowDeployment()
    deployment.release.set()
    client = _Beats(stop_after=3)  # the first answer deploys operator 7
    warm = iter([False, True, True])
    loop = HeartbeatLoop("app-0001-c3", client, deployment, _STATS,  # type: ignore[arg-type]
                         ("127.0.0.1", 7001), 20, spare_interval_ms=5,
                         spark_warm=lambda: next(warm))
    try:
        assert loop.spare_interval_ms == 5
        assert loop.run() == "aborted by the master"
        assert [beat.spark_warm for beat in client.beats] == [False, True, True]
        assert loop.spare_interval_ms == 0  # given an operator: a spare no more
        assert loop.deploys.wait_idle(10) and deployment.deployed == [7]
    finally:
        loop.close()
