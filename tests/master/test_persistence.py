"""The master's journal of applications: what a restarted master takes back, and "loading"."""

from __future__ import annotations

import errno

import grpc
import pytest

from tests.master.fakes import (
    ManualClock,
    chain_descriptor,
    container_heartbeat,
    operator_report,
    window,
)
from weir.master.client import WeirClient, WeirClientError
from weir.master.core import MasterCore
from weir.master.launcher import RecordingLauncher
from weir.master.persistence import ApplicationJournal
from weir.master.server import MasterServer, MasterStartError
from weir.operators.windows import make_window_id
from weir.proto import umbilical_pb2


def started_core(tmp_path, clock) -> MasterCore:
    return MasterCore(RecordingLauncher(), clock=clock,
                      journal=ApplicationJournal(str(tmp_path / "journal")))


def test_a_restarted_core_takes_back_its_applications_as_they_were(tmp_path):
    clock = ManualClock()
    core = started_core(tmp_path, clock)
    app_id = core.submit(chain_descriptor(2, CONTAINERS=1, STATE_DIR=str(tmp_path / "state")),
                         {})
    app = core.application(app_id)
    (cid,) = app.plan.containers
    core.heartbeat(container_heartbeat(cid))  # the container registers, operators deploy
    base = app.start_window_millis // 1000
    w = make_window_id(base, 3)
    core.heartbeat(container_heartbeat(cid, operators=[
        operator_report(op_id, windows=[window(w, checkpoint=w)])
        for op_id in app.plan.operators]))
    assert app.committed_window_id == w
    core.journal.close()

    clock.advance(60_000)  # a minute later, a new master process on the same journal
    again = started_core(tmp_path, clock)
    assert again.restore() == 1
    restored = again.application(app_id)
    assert restored.state == app.state and restored.committed_window_id == w
    assert restored.dag == app.dag
    assert [op.payload for op in restored.plan.operators.values()] == [
        op.payload for op in app.plan.operators.values()]
    assert {op.state for op in restored.plan.operators.values()} == {
        op.state for op in app.plan.operators.values()}
    # its containers get a fresh heartbeat timeout, not one that ran out while it was away
    assert restored.container_stats[cid].last_heartbeat_ms == clock.now_ms
    assert again.submit(chain_descriptor(2), {}) == "app-0002"
    response = again.heartbeat(container_heartbeat(cid, operators=[
        operator_report(op_id) for op_id in restored.plan.operators]))
    assert not response.deploy_request and response.committed_window_id == w


def test_a_heartbeat_writes_what_it_changed_in_other_containers_too(tmp_path):
    """A heartbeat's write looks only at its container's operators and those whose
    recovery window it moved: a checkpoint of the sink moves the upstream operators'
    recovery windows (other containers); a restarted master has them all as they were."""
    clock = ManualClock()
    core = started_core(tmp_path, clock)
    app_id = core.submit(chain_descriptor(3, CONTAINERS=3,
                                          STATE_DIR=str(tmp_path / "state")), {})
    app = core.application(app_id)
    for port, cid in enumerate(app.plan.containers):
        core.heartbeat(container_heartbeat(cid, port=7000 + port))
    base = app.start_window_millis // 1000
    located = {op.id: op.container_id for op in app.plan.operators.values()}
    port_of = {cid: 7000 + i for i, cid in enumerate(app.plan.containers)}
    for counter in (3, 7):  # each container in turn reports its operator's checkpoint
        w = make_window_id(base, counter)
        for op_id in sorted(located):  # the sink last: its checkpoint moves the others
            cid = located[op_id]
            core.heartbeat(container_heartbeat(cid, port=port_of[cid], operators=[
                operator_report(op_id, windows=[window(w, checkpoint=w)])]))
    assert app.committed_window_id == make_window_id(base, 7)
    live = {op.id: (op.recovery_window_id, list(app.checkpoints[op.id].windows))
            for op in app.plan.operators.values()}
    core.journal.close()
    again = started_core(tmp_path, clock)
    again.restore()
    restored = again.application(app_id)
    assert {op.id: (op.recovery_window_id, list(restored.checkpoints[op.id].windows))
            for op in restored.plan.operators.values()} == live
    assert restored.committed_window_id == app.committed_window_id


def fields_of(op) -> dict:
    """Every field of an operator but the clocks a restore starts again (``resume``)."""
    import dataclasses

    return {k: v for k, v in dataclasses.asdict(op).items()
            if k not in ("ready_ms", "deployed_ms")}


def test_an_operator_record_holds_its_changing_fields_and_the_plan_record_the_rest(tmp_path):
    """Every field of every operator comes back, though an operator's own record holds
    only what changes (its state, windows, failures); what only planning sets is in the
    plan record, written once."""
    import pickle

    from weir.master import persistence

    clock = ManualClock()
    core = started_core(tmp_path, clock)
    app_id = core.submit(chain_descriptor(3, CONTAINERS=2, STATE_DIR=str(tmp_path / "s")), {})
    app = core.application(app_id)
    for cid in app.plan.containers:
        core.heartbeat(container_heartbeat(cid))
    op = next(iter(app.plan.operators.values()))
    record = pickle.loads(persistence._operator_record(app, op))
    assert "attributes" not in record[0] and "inputs" not in record[0]
    assert "state" in record[0] and "recovery_window_id" in record[0]
    live = {op.id: fields_of(op) for op in app.plan.operators.values()}
    core.journal.close()
    again = started_core(tmp_path, clock)
    again.restore()
    restored = again.application(app_id)
    assert {op.id: fields_of(op) for op in restored.plan.operators.values()} == live


def test_a_journal_whose_operator_records_are_whole_loads_and_is_rewritten(tmp_path):
    """A journal written before the plan record kept the operators' static fields: its
    whole-operator records load, and the next save writes the plan record again, so the
    slim records written from then on can be read back."""
    import dataclasses
    import pickle

    clock = ManualClock()
    core = started_core(tmp_path, clock)
    app_id = core.submit(chain_descriptor(2, CONTAINERS=1, STATE_DIR=str(tmp_path / "s")), {})
    app = core.application(app_id)
    (cid,) = app.plan.containers
    core.heartbeat(container_heartbeat(cid))
    journal = core.journal.journal
    payloads = {op_id: op.payload for op_id, op in app.plan.operators.items()}
    journal.put_many([(f"{app_id}/plan", pickle.dumps((app.dag, payloads, set()))), *[
        (f"{app_id}/op/{op.id}", pickle.dumps((dataclasses.replace(op, payload=b""),
                                                app.checkpoints.get(op.id),
                                                app.operator_stats[op.id])))
        for op in app.plan.operators.values()]])
    live = {op.id: fields_of(op) for op in app.plan.operators.values()}
    core.journal.close()
    older = started_core(tmp_path, clock)
    older.restore()
    restored = older.application(app_id)
    assert {op.id: fields_of(op) for op in restored.plan.operators.values()} == live
    base = restored.start_window_millis // 1000
    w = make_window_id(base, 3)
    older.heartbeat(container_heartbeat(cid, operators=[
        operator_report(op_id, windows=[window(w, checkpoint=w)])
        for op_id in restored.plan.operators]))
    assert restored.committed_window_id == w
    older.journal.close()
    newest = started_core(tmp_path, clock)
    newest.restore()
    assert newest.application(app_id).committed_window_id == w


def test_an_unchanged_application_is_not_written_again(tmp_path):
    core = started_core(tmp_path, ManualClock())
    app_id = core.submit(chain_descriptor(2, CONTAINERS=1), {})
    (cid,) = core.application(app_id).plan.containers
    core.heartbeat(container_heartbeat(cid))
    active = container_heartbeat(cid, operators=[
        operator_report(op_id, state=umbilical_pb2.OPERATOR_STATE_ACTIVE)
        for op_id in core.application(app_id).plan.operators])
    core.heartbeat(active)  # the operators turn ACTIVE: journaled
    writes = core.journal.writes
    for _ in range(5):
        core.heartbeat(active)
    assert core.journal.writes == writes


def test_while_loading_calls_are_refused_as_retryable_and_the_client_retries(tmp_path):
    server = MasterServer(launcher_factory=RecordingLauncher, state_dir=tmp_path / "master",
                          publish_secret=False, http_port=None)
    server.start()
    try:
        server._loading = True  # as while a long journal is read back
        told: list[str] = []
        with WeirClient(server.address, secret=server.secret, tls_ca=server.tls.cert,
                        loading_wait_s=1.2,
                        on_loading=told.append) as client:
            with pytest.raises(WeirClientError, match="still loading its journal"):
                client.applications()
            assert told and "loading its journal" in told[0]
            server._loading = False
            assert client.applications() == []
    finally:
        server.stop()


def test_a_restarted_server_keeps_its_secret_and_publishes_its_address(tmp_path):
    first = MasterServer(launcher_factory=RecordingLauncher, state_dir=tmp_path / "master",
                         publish_secret=False, http_port=None)
    first.start()
    first.stop()
    second = MasterServer(launcher_factory=RecordingLauncher, state_dir=tmp_path / "master",
                          publish_secret=False, http_port=None)
    second.start()
    try:
        assert second.secret == first.secret
        assert (tmp_path / "master" / "secret").stat().st_mode & 0o077 == 0
        assert second.address in (tmp_path / "master" / "master.json").read_text()
    finally:
        second.stop()


def test_a_corrupt_journal_stops_the_master_naming_the_file_and_offset(tmp_path):
    journal = ApplicationJournal(str(tmp_path / "master" / "journal"))
    for i in range(3):
        journal.journal.put("app-0001", f"state {i}".encode())
    journal.close()
    (segment,) = (tmp_path / "master" / "journal").glob("*.log")
    data = bytearray(segment.read_bytes())
    data[20] ^= 0xFF  # inside the first of three records
    segment.write_bytes(bytes(data))
    server = MasterServer(launcher_factory=RecordingLauncher, state_dir=tmp_path / "master",
                          publish_secret=False, http_port=None)
    with pytest.raises(MasterStartError, match=rf"cannot take back .*{segment} at byte 8"):
        server.start()


def test_a_write_that_failed_is_written_again_by_the_next_save(tmp_path, monkeypatch):
    core = started_core(tmp_path, ManualClock())
    app_id = core.submit(chain_descriptor(2, CONTAINERS=1), {})
    app = core.application(app_id)
    journal = core.journal
    journal.save(app, None)
    app.committed_window_id = 42  # a change, and the disk is full when it is saved

    def disk_full(writes):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(journal.journal, "put_many", disk_full)
        with pytest.raises(OSError):
            journal.save(app, None)
    assert journal.save(app, None), "the change was taken as saved though nothing was"
    journal.close()
    [(restored, _)] = ApplicationJournal(str(tmp_path / "journal")).load()
    assert restored.committed_window_id == 42


def test_a_journal_that_cannot_be_written_stops_the_master_not_its_containers(tmp_path):
    """Issue 17, item 4: the master may not answer what it could not make durable; it
    stops serving (containers keep running) and the next master takes the app back."""
    state = tmp_path / "master"
    server = MasterServer(launcher_factory=RecordingLauncher, state_dir=state,
                          publish_secret=False, http_port=None)
    server.start()
    cert = server.tls.cert
    try:
        with WeirClient(server.address, secret=server.secret, tls_ca=cert,
                        timeout_s=5) as client:
            app_id = client.submit(chain_descriptor(2, CONTAINERS=1), {})
        (cid,) = server.core.application(app_id).plan.containers

        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        server.core.journal.journal.put_many = full
        with pytest.raises(grpc.RpcError) as caught:  # the registration is not answered
            _umbilical(server).ProcessHeartbeat(container_heartbeat(cid), timeout=5)
        assert caught.value.code().name == "UNAVAILABLE"
        assert "cannot write its journal" in caught.value.details()
        assert "No space left on device" in caught.value.details()
        with WeirClient(server.address, secret=server.secret, tls_ca=cert, timeout_s=5,
                        loading_wait_s=0) as client, pytest.raises(WeirClientError) as why:
            client.applications()  # a call after the failed write learns why
        assert "cannot write its journal" in str(why.value)
        assert server.halted.wait(10)
        assert server.core.halted and not server.launcher.stopped  # containers keep running
        with WeirClient(server.address, secret=server.secret, tls_ca=cert, timeout_s=2,
                        loading_wait_s=0) as client, pytest.raises(WeirClientError):
            client.applications()  # nobody answers there any more
    finally:
        server.stop()
    assert not server.launcher.stopped  # stop() after a halt leaves them for the next master
    again = MasterServer(launcher_factory=RecordingLauncher, state_dir=state,
                         publish_secret=False, http_port=None)
    again.start()
    try:  # the last durable record: submitted, its container not yet registered
        assert again.core.application(app_id).state.value == "ACCEPTED"
    finally:
        again.stop()


def _umbilical(server: MasterServer):
    from tests.harness import master_channel
    from weir.proto import umbilical_pb2_grpc

    channel = master_channel(server.address, server.secret, server.tls.cert.read_bytes())
    return umbilical_pb2_grpc.StreamingContainerUmbilicalStub(channel)


def test_ended_applications_are_forgotten_after_their_time_or_past_the_count(tmp_path):
    """Issue 17, item 7: a long-lived master's memory (and journal) follows what runs."""
    clock = ManualClock()
    core = MasterCore(RecordingLauncher(), clock=clock, ended_apps_kept=2,
                      ended_app_ttl_ms=60_000,
                      journal=ApplicationJournal(str(tmp_path / "journal")))
    ended = []
    for _ in range(4):
        app_id = core.submit(chain_descriptor(2, CONTAINERS=1), {})
        core.kill_application(app_id, "done")
        for container_id in core.application(app_id).plan.containers:
            core.launcher.set_exit_code(container_id, 0)
        ended.append(app_id)
        clock.advance(1_000)
    running = core.submit(chain_descriptor(2, CONTAINERS=1), {})
    for _ in range(3):
        core.check_liveness()
    assert [a.id for a in core.list_applications()] == [*ended[2:], running]  # newest 2
    clock.advance(60_000)
    core.check_liveness()
    assert [a.id for a in core.list_applications()] == [running]  # past their time
    reopened = ApplicationJournal(str(tmp_path / "journal"))
    assert [app.id for app, _ in reopened.load()] == [running]
    with pytest.raises(Exception, match="unknown application"):
        core.application_info(ended[0])


def test_a_loop_pass_journals_every_operator_after_a_loss_and_only_touched_ones_else():
    from tests.master.cluster import chain
    from weir.master.persistence import loop_changes

    app = chain().app
    app.take_touched()
    app.touched(2)
    assert loop_changes(app, lost=False) == {2}
    assert loop_changes(app, lost=False) == set()  # taken: the next pass looks at none
    app.touched(3)
    assert loop_changes(app, lost=True) is None  # a loss: every operator is looked at
