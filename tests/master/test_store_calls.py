"""A store that never answers holds up only the request that needs it, never the master:
savepoint and state-folder calls run outside the core lock, bounded by the master's store
timeout, while every application's containers are answered as usual.

The store is real: an S3 endpoint on loopback that accepts connections and never replies
(pyarrow's S3 client waits about 99 s on it), or, for the manifest write, one that blocks
until the test lets it go."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

import weir.master.run_store as run_store
from tests.harness import master_channel, poll_for
from tests.master.fakes import chain_descriptor, container_heartbeat, operator_report, window
from tests.master.test_protocol import window_ids
from weir.master.client import WeirClient, WeirClientError
from weir.master.launcher import RecordingLauncher
from weir.master.server import MasterServer
from weir.proto import umbilical_pb2_grpc

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def black_hole():
    """An endpoint that accepts every connection and never answers; ``.called`` is set
    once something connected to it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    held: list[socket.socket] = []
    called = threading.Event()
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
                called.set()
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    endpoint = f"127.0.0.1:{server.getsockname()[1]}"
    yield endpoint, called
    stop.set()
    thread.join(timeout=5)
    for sock in held:
        sock.close()
    server.close()


def s3(endpoint: str, name: str) -> str:
    return f"s3://KEY:TOPSECRET@bucket/{name}?endpoint_override={endpoint}&scheme=http"


@pytest.fixture
def master_with(tmp_path):
    master = MasterServer(launcher_factory=RecordingLauncher, loop_interval_s=0.05,
                          container_stop_grace_ms=300)
    master.start()
    master.core.store.timeout_s = 1.0
    try:
        yield master
    finally:
        master.stop()


@pytest.fixture
def client(master_with):
    with WeirClient(master_with.address, timeout_s=30) as weir:
        yield weir


@pytest.fixture
def umbilical(master_with):
    channel = master_channel(master_with.address, master_with.secret)
    try:
        yield umbilical_pb2_grpc.StreamingContainerUmbilicalStub(channel)
    finally:
        channel.close()


def beat(umbilical, cid: str, *reports):
    """A heartbeat, answered within gRPC's deadline or failing the test."""
    return umbilical.ProcessHeartbeat(container_heartbeat(cid, port=7000, operators=reports),
                                      timeout=10)


def two_running_apps(client, umbilical) -> list[str]:
    apps = [client.submit(chain_descriptor(1), {"CONTAINERS": "1"}) for _ in range(2)]
    for app_id in apps:
        deploy(umbilical, f"{app_id}-c0")
    return apps


def deploy(umbilical, cid: str) -> list[int]:
    """Plays the container up to every operator ACTIVE; returns their ids."""
    beat(umbilical, cid)
    ids = [d.id for d in beat(umbilical, cid).deploy_request]
    assert ids
    beat(umbilical, cid, *(operator_report(i) for i in ids))
    return ids


def test_a_savepoint_into_a_store_that_never_answers_holds_up_no_heartbeat(
        client, umbilical, black_hole):
    endpoint, called = black_hole
    first, second = two_running_apps(client, umbilical)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.take_savepoint, first, s3(endpoint, "sp"), stop=True)
        assert called.wait(30), "the master never asked the store"
        for app_id in (first, second):  # answered while the store says nothing
            assert beat(umbilical, f"{app_id}-c0").shutdown == 0
        assert [a.state for a in client.applications()] == ["RUNNING", "RUNNING"]
        with pytest.raises(WeirClientError) as refused:
            pending.result(timeout=60)
    assert refused.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "the savepoint at s3://***@bucket/sp" in str(refused.value)
    assert "did not answer within 1 s" in str(refused.value)
    assert "TOPSECRET" not in str(refused.value)
    assert client.application(first).savepoint_path == ""  # nothing was started


@pytest.mark.slow
def test_a_submit_from_a_savepoint_in_a_store_that_never_answers_holds_up_no_heartbeat(
        client, umbilical, black_hole):
    endpoint, called = black_hole
    [running, _] = two_running_apps(client, umbilical)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.submit, chain_descriptor(1), {"CONTAINERS": "1"},
                              from_savepoint=s3(endpoint, "sp"))
        assert called.wait(30), "the master never asked the store"
        assert beat(umbilical, f"{running}-c0").shutdown == 0
        with pytest.raises(WeirClientError) as refused:
            pending.result(timeout=60)
    assert refused.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert len(client.applications()) == 2  # nothing was submitted


@pytest.mark.slow
def test_a_state_dir_in_a_store_that_never_answers_refuses_the_submit_alone(
        client, umbilical, black_hole):
    endpoint, called = black_hole
    [running, _] = two_running_apps(client, umbilical)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.submit, chain_descriptor(1),
                              {"CONTAINERS": "1", "STATE_DIR": s3(endpoint, "state")})
        assert called.wait(30), "the master never asked the store"
        assert beat(umbilical, f"{running}-c0").shutdown == 0
        with pytest.raises(WeirClientError) as refused:
            pending.result(timeout=60)
    assert refused.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "STATE_DIR s3://***@bucket/state?" in str(refused.value)
    assert "did not answer within 1 s" in str(refused.value)
    # the folder it reserved is free again: the next submit may name it
    assert client.submit(chain_descriptor(1), {"CONTAINERS": "1"})


def test_a_manifest_write_that_never_returns_fails_the_savepoint_and_lets_the_window_go(
        client, umbilical, tmp_path, monkeypatch):
    release = threading.Event()
    asked = threading.Event()

    def never_answers(path, manifest):
        asked.set()
        release.wait(60)

    monkeypatch.setattr(run_store, "write_manifest", never_answers)
    app_id = client.submit(chain_descriptor(1), {"CONTAINERS": "1"})
    cid = f"{app_id}-c0"
    ids = deploy(umbilical, cid)
    w = window_ids(client, app_id)

    def checkpoint(counter: int) -> int:
        windows = [window(w(counter), checkpoint=w(counter))]
        return beat(umbilical, cid, *(operator_report(i, windows=windows) for i in ids)
                    ).committed_window_id

    checkpoint(10)
    path = str(tmp_path / "sp")
    client.take_savepoint(app_id, path)
    try:
        assert checkpoint(20) == w(10)  # held at the savepoint's window
        reports = [operator_report(i) for i in ids]
        for report in reports:
            report.savepoint_written = path
        beat(umbilical, cid, *reports)  # the last parts: the manifest is due
        assert asked.wait(30)
        assert client.application(app_id).savepoint_state == "writing"
        assert beat(umbilical, cid).committed_window_id == w(10)  # answered meanwhile
        state = poll_for(lambda: (s := client.application(app_id).savepoint_state)
                         .startswith("failed") and s, 30, "the savepoint to fail")
        assert "did not answer within 1 s" in state
        assert checkpoint(30) == w(30)  # the window it held is let go
    finally:
        release.set()
